"""A closed list of training-set checks, made before the run folder is created, each refused in one line
(:class:`~yolo_ckpt.errors.ConfigError`, exit 2 on the CLI):

1. no labels at all (no label file, or only empty ones);
2. labels of the wrong kind for the task: box-only (5-column) rows for ``segment`` or ``obb``, which need polygons
   (Ultralytics' ``YOLODataset.verify_labels`` rule: as many segments as boxes); pose rows without the data's
   ``kpt_shape`` columns (check 3);
3. a label file Ultralytics' ``verify_image_label`` rejects: a class id >= nc, a negative, NaN or out-of-range
   coordinate, a non-integer class, the wrong number of columns. **Stricter than stock**, which drops such an image
   from training with a warning in a long scan log; here the run stops, naming the file, the reason and how many;
4. every training image corrupt (stock: ``No valid images found``, after the run folder is written).

Where more than :data:`BACKGROUND_WARNING` of the images have no labels (background images), a warning, not an error;
where some images (not all) cannot be read, one warning line naming the first, the real reason and how many: stock
leaves them out of training with a reason that can mislead (``No module named 'pi_heif'`` for a file that is no image),
and so does the run.

The labels are read as the trainer reads them: Ultralytics' own ``YOLODataset`` scan (``verify_image_label`` per image,
on its thread pool), from the label cache (``labels/train.cache``) when one matches the images and the scan settings,
and no cache is written (the trainer writes it, as stock, when it builds its dataset). Without a cache the images are
verified once more than stock does (a header read each; seconds per 10,000 images). Only the training split of the
tasks detect, segment, obb and pose, read by Ultralytics' YOLO dataset (DetectionTrainer's or RTDETRTrainer's
``build_dataset``), with a ``data=`` YAML, is checked.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ultralytics.utils import LOGGER

from ..errors import ConfigError, one_line
from ..memory import label_caches_in_memory

CHECKED_TASKS = ("detect", "segment", "obb", "pose")
BACKGROUND_WARNING = 0.5  # share of training images without labels above which the check warns
CORRUPT = ": ignoring corrupt image/label: "  # verify_image_label's message for a rejected image or label (data/utils.py)


def scan_labels(data: dict, task: str, fraction: float = 1.0, single_cls: bool = False) -> tuple[dict, Path]:
    """The training split's label scan as ``YOLODataset.get_labels`` makes it (``_load_or_scan_cache``), writing no
    cache (:func:`~yolo_ckpt.memory.ultralytics_rules.label_caches_in_memory`): an existing one is reused where its
    version and hash match, on disk or kept by an open ``label_caches_in_memory`` block.

    Returns:
        ``(cache, cache_path)``: the scan (``labels``: per-image dicts with ``cls``, ``bboxes``, ``segments``;
        ``msgs``; ``results``: found, missing, empty, corrupt, total) and where the cache is or would be.

    Raises:
        ConfigError: for a training path with no images (Ultralytics' ``get_img_files``), naming it.
    """
    from ultralytics.data import dataset as yolo_dataset

    ds = yolo_dataset.YOLODataset.__new__(yolo_dataset.YOLODataset)  # the scan's attributes only: no images loaded
    ds.prefix, ds.fraction, ds.augment, ds.single_cls, ds.data = "", fraction, False, single_cls, data
    ds.use_segments, ds.use_keypoints, ds.use_obb = task == "segment", task == "pose", task == "obb"
    try:
        ds.im_files = ds.get_img_files(data["train"])
    except FileNotFoundError as e:  # e.g. a download: that ran and left train: missing
        raise ConfigError(f"data={data.get('yaml_file', '')}: train: {data['train']}: {one_line(e.__cause__ or e)}") from None
    cache_path = Path(ds.get_label_files()[0]).parent.with_suffix(".cache")
    level = LOGGER.level
    LOGGER.setLevel(logging.ERROR)  # the trainer logs the scan's messages when it builds its dataset
    try:
        with label_caches_in_memory():
            cache, _ = ds._load_or_scan_cache(cache_path, ds.get_cache_hash())
    finally:
        LOGGER.setLevel(level)
    return cache, cache_path


def _unreadable(im_file: str) -> str | None:
    """Why Ultralytics cannot read the image ``im_file``, or None where it reads: its own ``check_image``
    (``data/utils.py`` line 256) with PIL's own ``Image.open``. Ultralytics' patched ``Image.open``
    (``utils/patches.py`` line 78) answers any file PIL cannot identify by trying to install a HEIF plugin, and its
    scan then reports that plugin's absence (``No module named 'pi_heif'``) as the image's fault; for a HEIF file
    (``.heic``, ``.heif``) that is the reason, and is kept."""
    from PIL import Image
    from ultralytics.data.utils import check_image
    from ultralytics.utils import patches

    patched = Image.open
    if Path(im_file).suffix.lower() not in {".heic", ".heif"}:
        Image.open = patches._image_open  # PIL's own, which Ultralytics keeps
    try:
        check_image(im_file)
    except Exception as e:
        return one_line(e)
    finally:
        Image.open = patched
    return None


def _rejected(msgs: list[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(labels, images)``: ``(label file, reason)`` of each image ``verify_image_label`` rejected for its label, and
    ``(image file, the real reason)`` of each rejected for its image (:func:`_unreadable`; where it reads, the label
    was the cause)."""
    from ultralytics.data.utils import img2label_paths
    from ultralytics.utils import remove_colorstr

    labels, images = [], []
    for msg in msgs:
        if CORRUPT not in msg:
            continue
        im_file, reason = msg.split(CORRUPT, 1)
        im_file = remove_colorstr(im_file)
        if not Path(im_file).exists():  # a scan of a trainer's dataset: its messages start with the split ("train: ")
            im_file = im_file.partition(": ")[2]
        fault = _unreadable(im_file)
        if fault is None:
            labels.append((img2label_paths([im_file])[0], reason))
        else:
            images.append((im_file, fault))
    return labels, images


def check_labels(data: dict, task: str, fraction: float = 1.0, single_cls: bool = False) -> None:
    """The closed list of checks (module docstring) on the training split of ``data`` (a ``check_det_dataset`` dict).

    Raises:
        ConfigError: one line naming the check that failed, the file or folder, and what the task needs.
    """
    nkpt, ndim = data.get("kpt_shape", (0, 0))
    if task == "pose" and (nkpt <= 0 or ndim not in {2, 3}):  # YOLODataset.__init__'s check, before the label scan
        raise ConfigError(
            f"data={data.get('yaml_file', '')}: task=pose needs kpt_shape: [keypoints, 2 or 3] (e.g. kpt_shape: [17, 3]), got "
            f"{data.get('kpt_shape')!r}"
        )
    cache, cache_path = scan_labels(data, task, fraction, single_cls)
    found, missing, empty, corrupt, total = cache["results"]
    labels, where = cache["labels"], cache_path.with_suffix("")
    rejected, unreadable = _rejected(cache["msgs"])
    if rejected:
        file, reason = rejected[0]
        raise ConfigError(
            f"{file}: {one_line(reason)} ({len(rejected)} of {total} label files rejected; nc={len(data['names'])}). "
            "Stock Ultralytics drops these images from training with a warning; yolo-ckpt refuses them: fix or remove those labels"
        )
    if total and not labels:
        first = next((m.split(CORRUPT, 1)[-1] for m in cache["msgs"] if CORRUPT in m), "")
        first = f"{unreadable[0][0]}: {unreadable[0][1]}" if unreadable else first
        raise ConfigError(f"data={data.get('yaml_file', '')}: all {total} training images are corrupt ({one_line(first)})")
    if unreadable:  # stock leaves them out, with a misleading reason in a long scan log: one line, the real reason
        file, reason = unreadable[0]
        LOGGER.warning(
            f"{file}: not a readable image ({reason}); {len(unreadable)} of {total} training images cannot be read and are left "
            "out of training, as stock Ultralytics leaves them out"
        )
    boxes = sum(len(lb["bboxes"]) for lb in labels)
    if boxes == 0:
        raise ConfigError(
            f"data={data.get('yaml_file', '')}: no labels at all for the {total} training images (label files are looked for in "
            f"{where}: one <image name>.txt per image)"
        )
    segments = sum(len(lb["segments"]) for lb in labels)
    if task in {"segment", "obb"} and segments != boxes:  # YOLODataset.verify_labels' rule, raised there after the run folder is written
        need = (
            "polygons (class x1 y1 x2 y2 x3 y3 ...)" if task == "segment" else "rotated boxes as 4 corners (class x1 y1 x2 y2 x3 y3 x4 y4)"
        )
        raise ConfigError(f"{where}: {boxes - segments} of {boxes} labels are boxes only (class x y w h); task={task} needs {need}")
    if total and (missing + empty) / total > BACKGROUND_WARNING:
        LOGGER.warning(
            f"{where}: {missing + empty} of {total} training images have no labels (background images); more than "
            f"{BACKGROUND_WARNING:.0%} is unusual: check the labels folder"
        )


def check_train_labels(trainer_cls: type, task: str, args) -> None:
    """:func:`check_labels` for a trainer class of ``task`` and its args (``get_cfg``'s), where the module
    docstring's scope covers them (not for a resumed run, whose data trained already).

    Raises:
        ConfigError: as :func:`check_labels`. RuntimeError: for a ``data=`` Ultralytics' ``check_det_dataset`` cannot
            read, as ``BaseTrainer.get_dataset`` raises it ("Dataset '...' error ...", engine/trainer.py), so that a
            dataset's ``download:`` runs once, here, and not again in the trainer.
    """
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.models.rtdetr.train import RTDETRTrainer
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.utils import clean_url, emojis

    yolo_dataset = trainer_cls.build_dataset in {DetectionTrainer.build_dataset, RTDETRTrainer.build_dataset}
    data = str(args.data or "")
    if args.resume or not yolo_dataset or task not in CHECKED_TASKS or Path(data).suffix.lower() not in {".yaml", ".yml"}:
        return
    try:
        checked = check_det_dataset(data, split=args.split)
    except Exception as e:
        raise RuntimeError(emojis(f"Dataset '{clean_url(data)}' error ❌ {e}")) from e
    check_labels(checked, task, args.fraction, args.single_cls)
