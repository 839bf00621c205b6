"""Pixel-BERT configuration: VL-BERT's (so that one builder makes either model) plus the pixel settings."""

from __future__ import annotations

from .configuration_study import StudyConfig

CNNS = ("detector", "resnet50")
# The paper's image sizes for ResNet-50 (shorter side, longer side at most).
RESNET_IMAGE_SIZES = (800, 1333)


class PixelBertConfig(StudyConfig):
    """
    StudyConfig's fields keep their meaning where Pixel-BERT has them: the BERT sizes, `frcnn`
    (the trained detector, whose trunk is the CNN when cnn="detector"), `num_answers`, and
    `img_token_id` / `end_token_id` (the elements of VL-BERT's input layout that Pixel-BERT drops).
    The region fields (visual_feature_dim, geometry_wavelengths, num_visual_classes,
    visual_scale_text_init, tags_at_region_scale, tag_coattention_mask) are accepted and unused,
    and so is `tune_frcnn`:
    the CNN trains end to end, as in the paper (its rate is the optimiser's: parameters
    `pixelbert.cnn.*`), as far as `cnn_trainable_layers` says.

    pixel_samples: pixel tokens kept per image in pre-training, a fresh random draw each step (the
        paper keeps 100 of a ResNet-50 map's ~260); 0: no sampling. Only PixelBertForPreTraining
        samples, and only in train mode.
    pixel_sampling_warmup_epochs: pre-training's first epochs keep every pixel token; sampling
        (pixel_samples) starts after them. Read by the pre-training stage, which tells the model
        each step's count (`PixelBertForPreTraining.forward`'s `pixel_samples`).
    pixel_pool: the paper's 2x2 max-pool after the pixel embedding's 3x3 conv. True, False, or
        None: where the map is large enough, i.e. when the CNN's map of an image at `image_min_size`
        has at least `POOL_MIN_SIDE` (16) cells on its shorter side, so that the pooled map keeps
        8 or more (ResNet-50 at 800 px: 25 cells, pooled, the paper's 64x down-sampling; a 96-px
        image through a stride-16 detector trunk: 6 cells, kept whole).
    pixel_standardise: each channel of the C5 map standardised (its mean and deviation over the
        cells of the training images that lie on their image, set by `fit_pixel_statistics`) before
        the pixel embedding's conv, as VL-BERT centres its regions' appearance features. False:
        the map as the CNN gives it.
    pixel_whiten: the C5 map's cells whitened (ZCA, on the same statistics as pixel_standardise,
        with their covariance) before the pixel embedding's conv: a fixed linear map that the conv
        could absorb, so the model is the same and only its learning changes. Colour is 3 to 4% of
        a cell's variance on the mini world (20 to 30% of a detector region's), too small a
        component for masked words to learn to read; whitened, with the CNN frozen in pre-training,
        it is read (not with the CNN trained: reports/reference/mini/levers.md). Not with
        pixel_standardise.
    cnn: "detector": the detector's trunk (its ResNet to C4, then its C5 stage over the whole map),
        initialised from the study's detector by `load_detector` (a trained one, or a given
        detectron2 C4 model: its backbone to res4 and res5, normalised as its config says); "resnet50": torchvision's
        ResNet-50 to C5, for real images, its ImageNet weights loaded by the caller
        (`cnn.load_resnet_state`), never downloaded.
    cnn_trainable_layers: the CNN's stages that train, counted from its last, as torchvision's
        `trainable_backbone_layers`: 5 every stage (the paper), 1 only C5, 0 none; the others are
        frozen. With the trunk to C4 frozen (1 or 0), an image given with a key has that part
        computed once (`PixelBertCNN`): fine-tuning reads each image many times. In a preset,
        `model.pixelbert.cnn_trainable_layers` sets it for pre-training; each fine-tuning section's
        own key overrides it for that task.
    c5_dilation: the C5 stage's stride replaced by dilation (DeepLab's output stride;
        torchvision's `replace_stride_with_dilation`), the same weights: the map at C4's stride, four
        times the cells and pixel tokens (a 96-px image through the stride-8 detector trunk: 12 x
        12 instead of 6 x 6), so that a small object spans several tokens instead of one.
    image_min_size, image_max_size: images are resized so that their shorter side is
        `image_min_size` unless their longer side would pass `image_max_size`. None: the detector's
        `image_size` (cnn="detector"; the longer side then defaults to the shorter's, as the
        detector resizes), a given detectron2 model's test sizes (`INPUT.MIN_SIZE_TEST`,
        `MAX_SIZE_TEST`), the paper's 800 and 1333 (cnn="resnet50").
    """

    model_type = "pixelbert"

    def __init__(
        self,
        pixel_samples: int = 0,
        pixel_sampling_warmup_epochs: int = 0,
        pixel_pool: bool | None = None,
        pixel_standardise: bool = False,
        pixel_whiten: bool = False,
        cnn: str = "detector",
        image_min_size: int | None = None,
        image_max_size: int | None = None,
        cnn_trainable_layers: int = 5,
        c5_dilation: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if cnn not in CNNS:
            raise ValueError(f"PixelBertConfig.cnn must be one of {', '.join(CNNS)}, got {cnn!r}")
        if pixel_samples < 0:
            raise ValueError(f"PixelBertConfig.pixel_samples must be >= 0, got {pixel_samples}")
        if pixel_sampling_warmup_epochs < 0:
            raise ValueError(
                f"PixelBertConfig.pixel_sampling_warmup_epochs must be >= 0, got {pixel_sampling_warmup_epochs}"
            )
        if pixel_standardise and pixel_whiten:
            raise ValueError(
                "PixelBertConfig: pixel_standardise and pixel_whiten are two ways to scale the map; set one"
            )
        if not 0 <= cnn_trainable_layers <= 5:
            raise ValueError(f"PixelBertConfig.cnn_trainable_layers must be 0 to 5, got {cnn_trainable_layers}")
        self.cnn_trainable_layers = cnn_trainable_layers
        self.c5_dilation = c5_dilation
        self.pixel_samples = pixel_samples
        self.pixel_sampling_warmup_epochs = pixel_sampling_warmup_epochs
        self.pixel_pool = pixel_pool
        self.pixel_standardise = pixel_standardise
        self.pixel_whiten = pixel_whiten
        self.cnn = cnn
        self.image_min_size = image_min_size
        self.image_max_size = image_max_size

    @property
    def image_sizes(self) -> tuple[int, int]:
        """(shorter side, longer side at most) that images are resized to."""
        if self.cnn == "resnet50":
            return self.image_min_size or RESNET_IMAGE_SIZES[0], self.image_max_size or RESNET_IMAGE_SIZES[1]
        if self.frcnn is None:
            raise ValueError('PixelBertConfig: cnn="detector" needs frcnn, the detector\'s config')
        if self.frcnn.get("backend") == "detectron2":  # its config's test-time sizes
            min_size, max_size = self.frcnn["image_sizes"]
            return self.image_min_size or min_size, self.image_max_size or max_size
        size = self.image_min_size or self.frcnn["image_size"]
        return size, self.image_max_size or size
