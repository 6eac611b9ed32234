"""Write the built-in synthetic dataset of every task into the cache and print where: python datasets/make_synthetic.py [seed]"""

import sys

from yolo_ckpt.data.synthetic import TASKS, synthetic_dataset

if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    for task in TASKS:
        print(f"{task:<9} {synthetic_dataset(task, seed=seed)}")
