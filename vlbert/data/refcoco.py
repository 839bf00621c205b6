"""RefCOCO+ reader: REFER's `refs(unc).p` (a pickle, loaded without running code) + instances.json."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .coco import read_coco
from .errors import DataFormatError, require_file, require_keys, require_nonempty
from .safe_pickle import load_plain_pickle

SPLITS = ("train", "val", "testA", "testB")


@dataclass(frozen=True)
class RefExpression:
    ref_id: int
    sent_id: int
    sentence: str
    tokens: list[str]
    ann_id: int
    image_id: int
    category_id: int
    bbox: list[float]  # ground-truth box of the referred object, COCO [x, y, w, h]
    image_path: Path
    split: str


class RefCOCO:
    """The refs of one data set with their COCO annotations, queried by split."""

    def __init__(self, root, refs_name: str = "refs(unc).p", instances_name: str = "instances.json", image_root=None):
        root = Path(root)
        self.refs_path = require_file(root / refs_name, "RefCOCO+ refs")
        self.coco = read_coco(root / instances_name, image_root or root / "images")
        refs = load_plain_pickle(self.refs_path)
        if not isinstance(refs, list):
            raise DataFormatError(self.refs_path, f"expected a list of refs, got {type(refs).__name__}")
        for k, ref in enumerate(refs):
            require_keys(
                ref,
                ["ref_id", "ann_id", "image_id", "split", "sentences", "category_id"],
                self.refs_path,
                prefix=f"[{k}].",
            )
            if ref["ann_id"] not in self.coco.anns:
                raise DataFormatError(
                    self.refs_path, f"ann_id {ref['ann_id']} is not in instances.json", key=f"[{k}].ann_id"
                )
            if ref["image_id"] not in self.coco.imgs:
                raise DataFormatError(
                    self.refs_path, f"image_id {ref['image_id']} is not in instances.json", key=f"[{k}].image_id"
                )
            for n, sentence in enumerate(ref["sentences"]):
                require_keys(sentence, ["sent_id", "sent"], self.refs_path, prefix=f"[{k}].sentences[{n}].")
        self.refs = refs

    def expressions(self, split: str) -> list[RefExpression]:
        if split not in SPLITS:
            raise ValueError(f"unknown RefCOCO+ split {split!r}; expected one of {SPLITS}")
        out = []
        for ref in self.refs:
            if ref["split"] != split:
                continue
            image = self.coco.imgs[ref["image_id"]]
            for sentence in ref["sentences"]:
                out.append(
                    RefExpression(
                        ref["ref_id"],
                        sentence["sent_id"],
                        sentence["sent"],
                        sentence.get("tokens", sentence["sent"].split()),
                        ref["ann_id"],
                        ref["image_id"],
                        ref["category_id"],
                        self.coco.anns[ref["ann_id"]]["bbox"],
                        self.coco.image_root / image["file_name"],
                        split,
                    )
                )
        return require_nonempty(out, self.refs_path, f"expressions in split {split!r}")
