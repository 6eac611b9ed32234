"""The prefix of yolo-ckpt's lines in Ultralytics' log."""

from ultralytics.utils import colorstr

PREFIX = colorstr("yolo-ckpt: ")
