"""The controls beside Table 4's cells: images shuffled among the items, VQA's complementary pairs,
RefCOCO+'s rare-word subset."""

from pathlib import Path

import numpy as np
import pytest

from vlbert.evaluation.floors import word_subsets
from vlbert.evaluation.vqa_eval import pair_accuracy, question_accuracy
from vlbert.tasks.regions import Regions, with_other_images


def _regions(image: int, rois: int) -> Regions:
    rows = rois + 1
    return Regions(
        boxes=np.full((rows, 4), float(image)),
        labels=np.full(rows, image),
        features=np.arange(rows, dtype=np.float32)[:, None] + 100 * image,
        box_ids=np.arange(rows) + 10 * image,
        width=96,
        height=96,
        image_path=Path(f"{image}.jpg"),
        probs=np.full((rows, 3), float(image)),
    )


def test_shuffled_images_give_every_item_another_images_appearance_over_its_own_boxes():
    # two expressions of image 0 (RefCOCO+ refers to one image several times), images of 1 to 4 regions
    examples = [
        {"id": k, "regions": _regions(image, rois)}
        for k, (image, rois) in enumerate([(0, 3), (0, 3), (1, 1), (2, 4), (3, 2)])
    ]
    examples[1]["regions"] = _regions(0, 3)  # a second read of image 0: same image, another object
    shuffled = with_other_images(examples, seed=0)
    sources = []
    for before, after in zip(examples, shuffled):
        own, mixed = before["regions"], after["regions"]
        assert after["id"] == before["id"]
        np.testing.assert_array_equal(mixed.boxes, own.boxes)  # candidates and tags stay put
        np.testing.assert_array_equal(mixed.box_ids, own.box_ids)
        source = int(mixed.labels[0])
        assert source != int(own.labels[0]) and mixed.image_path == Path(f"{source}.jpg")
        other_rois = {0: 3, 1: 1, 2: 4, 3: 2}[source]
        expected_rows = [0] + [1 + k % other_rois for k in range(own.num_rois)]
        np.testing.assert_array_equal(mixed.features[:, 0], np.array(expected_rows) + 100 * source)
        sources.append(source)
    assert sources[0] == sources[1]  # one image, one replacement
    assert sorted(set(sources)) == [0, 1, 2, 3]  # a derangement of the four images
    assert with_other_images(examples, seed=0)[2]["regions"].image_path == shuffled[2]["regions"].image_path


def test_shuffling_needs_two_images():
    with pytest.raises(ValueError, match="at least two images"):
        with_other_images([{"regions": _regions(0, 2)}, {"regions": _regions(0, 2)}])


def _annotation(answer, others=None):
    answers = [answer] * 10 if others is None else [answer] * 7 + others
    return {"multiple_choice_answer": answer, "answers": [{"answer": a} for a in answers]}


def test_a_pair_counts_only_when_both_members_get_their_answer():
    annotations = {1: _annotation("red"), 2: _annotation("blue"), 3: _annotation("yes"), 4: _annotation("no")}
    pairs = [(1, 2), (3, 4)]
    assert pair_accuracy(annotations, {1: "red", 2: "blue", 3: "yes", 4: "no"}, pairs) == 100.0
    assert pair_accuracy(annotations, {1: "red", 2: "blue", 3: "yes", 4: "yes"}, pairs) == 50.0
    # one answer for both members, as a model that does not look gives: never a pair
    assert pair_accuracy(annotations, {1: "red", 2: "red", 3: "no", 4: "no"}, pairs) == 0.0
    # the minority answer of a member scores partial official accuracy, but not a right member
    noisy = {1: _annotation("red", ["blue"] * 3), 2: _annotation("blue")}
    assert pair_accuracy(noisy, {1: "blue", 2: "blue"}, [(1, 2)]) == 0.0
    # Compared as the official accuracy compares: ten humans "red" leave " Red." unnormalised (0
    # there, so not a right member); humans who disagree normalise it. Seen: "SQUARE" against ten
    # "square" scored 0 officially and made a right member.
    assert pair_accuracy(annotations, {1: " Red.", 2: "blue"}, [(1, 2)]) == 0.0
    assert pair_accuracy(noisy, {1: " Red.", 2: "blue"}, [(1, 2)]) == 100.0
    square = {1: _annotation("square"), 2: _annotation("blue")}
    assert pair_accuracy(square, {1: "SQUARE", 2: "blue"}, [(1, 2)]) == 0.0
    assert question_accuracy("SQUARE", ["square"] * 10) == 0.0
    with pytest.raises(ValueError, match="no complementary pair"):
        pair_accuracy(annotations, {}, [(1, 9)])


class _Expression:
    def __init__(self, sent_id, sentence):
        self.sent_id, self.sentence = sent_id, sentence


def test_rare_words_are_those_of_few_training_expressions():
    train = [_Expression(k, "the red circle") for k in range(5)] + [_Expression(9, "purple one")]
    evaluated = [_Expression(20, "red circle"), _Expression(21, "the purple square"), _Expression(22, "green one")]
    subsets = word_subsets(evaluated, train, max_train=4)
    # 'purple' and 'one' have one training expression, 'green' and 'square' none: rare
    assert subsets == {"rare": {21, 22}, "seen": {20}}


def test_a_training_fraction_is_the_same_examples_for_every_run():
    from vlbert.engine.seeding import training_subset

    tenth = training_subset(1000, 0.1)
    assert len(tenth) == 100 and tenth == sorted(set(tenth)) and tenth == training_subset(1000, 0.1)
    assert set(tenth) <= set(training_subset(1000, 0.3))  # the shares are nested
    assert training_subset(5, 0.01) == training_subset(5, 0.01) and len(training_subset(5, 0.01)) == 1
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        training_subset(10, 0.0)


def test_refcoco_s_pooled_accuracy_is_pooled_before_rounding():
    # Seen: 405 of 731 expressions right scored 55.41, the testA and testB figures pooled after
    # each was rounded; it is 55.40.
    from vlbert.tasks.refcoco import _pooled

    assert _pooled([True] * 405 + [False] * 326) == 55.40
    assert _pooled(iter([True, False, False])) == 33.33
