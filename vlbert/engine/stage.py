"""Training stages as objects, and the one runner that trains them (as Lightning separates a
LightningModule from its Trainer).

A `Stage` says what is trained and on what: it builds its data and schedule, its model, then its
optimiser and scheduler (`setup`'s three hooks), gives batch b of epoch e (`make_batch`), the loss
of a batch with its named parts (`training_step`), the validation metrics after an epoch
(`validate`), what the run is made from (`identity`: what its checkpoint records beside the
weights, optimiser, scheduler, RNG and position, so that only the same run resumes it), what the
tracker records of its set-up (`params`) and what it leaves when the training is done (`result`). The stages: BERT init
(bert_init.py), pre-training (pretrain.py), fine-tuning of any task family through its task
adapter (finetune.py).

`run_stage` wires the rest, the same for every stage: the training loop (loop.py: epochs,
checkpoints, resume), its callbacks (the tracker's records, the caller's own, such as a sweep's
Ray reporting, then the best epoch's weights; callbacks.py) and the final figures in the tracker.
Stages talk to no MLflow nor Ray: what they record goes through the runner's tracker.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.images import decoded_images
from .callbacks import BestEpoch, Tracking
from .distributed import wrap
from .loop import LoopConfig, LoopState, LoopSteps, TrainingLoop, loading_options, loop_speed


class Stage:
    """One training stage. `setup()` seeds the stage's randomness (`seed`), then calls its three
    hooks in this order, as each stage always has built; each sets what the runner reads from it:

    - `setup_data()`: the data and the schedule, `epochs`, `batches_per_epoch`, `batch_size`, and
      `validate_every` (epochs between validations; the last epoch is always validated). It draws
      nothing from the global RNG (a batch's randomness is its own, `make_batch`);
    - `setup_model()`: `model`, on `device`, ready for its first step. The model's initial draws
      follow the seed;
    - `setup_optimizer()`: `optimizer` and `scheduler`.

    It may set `precision` (fp32, bf16, fp16), its own autocast over the preset's `training.precision`.

    Class attributes: `select_metric`, the validation metric whose best epoch is kept (None: the
    last epoch); `validates`, whether an epoch is scored at all; `data_parallel`, whether the
    model trains under DDP when started by torchrun."""

    preset: dict
    out: Path
    seed: int
    device: str = "cpu"
    select_metric: str | None = None
    validates: bool = True
    data_parallel: bool = True

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    epochs: int
    batches_per_epoch: int
    batch_size: int
    validate_every: int = 1
    precision: str | None = None  # autocast of the training steps; None: the preset's training.precision

    # Each hook, and what it must have set when it returns.
    SETUP_HOOKS = (
        ("setup_data", ("epochs", "batches_per_epoch", "batch_size")),
        ("setup_model", ("model",)),
        ("setup_optimizer", ("optimizer", "scheduler")),
    )

    def setup(self) -> None:
        torch.manual_seed(self.seed)
        for hook, sets in self.SETUP_HOOKS:
            getattr(self, hook)()
            missing = [name for name in sets if name not in vars(self)]
            if missing:
                raise TypeError(f"{type(self).__name__}.{hook}() did not set {', '.join(missing)}")

    def setup_data(self) -> None:
        raise NotImplementedError

    def setup_model(self) -> None:
        raise NotImplementedError

    def setup_optimizer(self) -> None:
        raise NotImplementedError

    def params(self) -> dict:
        """What the tracker records of the run's set-up (its parameters)."""
        return {}

    def make_batch(self, epoch: int, b: int) -> dict:
        """Batch `b` of epoch `epoch`: its randomness from generators of (seed, epoch, b) only
        (seeding.py), as the loop may build it in another thread or process."""
        raise NotImplementedError

    def training_step(self, model, batch: dict) -> tuple[torch.Tensor, dict]:
        """The loss of `batch` and its named parts (each logged as loss_<name>)."""
        raise NotImplementedError

    def validate(self, model) -> dict:
        """The validation metrics of `model` after an epoch (with `validates`)."""
        return {}

    def datasets(self) -> list[dict]:
        """The data the run reads, for the tracker's inputs: each {name, digest, source, context
        (training, validation, test), profile (a dict: its items, a share of the training set)}."""
        return []

    def identity(self) -> dict:
        """What the run is made from (preset values, arguments, its inputs' identities): kept in its
        checkpoint beside the weights and training state; a checkpoint of another is not resumed."""
        raise NotImplementedError

    def result(self, state: LoopState, speed: dict) -> tuple[dict, dict]:
        """Once every epoch has run (`state`: the loop's; `speed`: loop_speed's): the outputs
        written, what the recipe returns, and the final figures for the tracker ({}: none)."""
        raise NotImplementedError


def run_stage(
    stage: Stage,
    tracker,
    progress: bool = True,
    callbacks: tuple = (),
    max_steps: int | None = None,
) -> dict:
    """Set `stage` up and train it in `stage.out`: resumed from its checkpoint when that is of the
    same run, recorded in `tracker`, `callbacks` called before the best epoch is kept (a sweep's
    Ray reporting). Returns the stage's result; with `max_steps` reached, only the loop's speed."""
    preset = stage.preset
    decoded_images.resize(int(preset.get("loading", {}).get("decoded_images_mb", 0)) << 20)
    stage.setup()
    tracker.log_params(stage.params())
    tracker.log_datasets(stage.datasets())
    model = wrap(stage.model, stage.device) if stage.data_parallel else stage.model
    loop = TrainingLoop(
        model,
        stage.optimizer,
        stage.scheduler,
        LoopConfig(
            stage.epochs,
            stage.batches_per_epoch,
            validate_every=stage.validate_every,
            max_steps=max_steps,
            progress=progress,
            **{**preset.get("training", {}), **({"precision": stage.precision} if stage.precision else {})},
            **loading_options(preset),
        ),
        stage.out,
        LoopSteps(stage.make_batch, stage.training_step, stage.validate if stage.validates else None),
        [Tracking(tracker), *callbacks, BestEpoch(select_metric=stage.select_metric)],
        identity=stage.identity(),
    )
    state = loop.fit()
    if max_steps is not None and state.step >= max_steps:
        return loop_speed(loop, stage.batch_size)
    result, final = stage.result(state, loop_speed(loop, stage.batch_size))
    if final:
        tracker.log_metrics(final, step=state.step)
    return result
