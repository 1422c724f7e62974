"""Training's launch (specops/ops/train.py): offline and online, CPU placement, the train spec's reader."""
