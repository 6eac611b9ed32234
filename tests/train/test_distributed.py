"""Training beyond one machine: torchrun with two "nodes" of one process each on the loopback address, gloo on the
CPU. The ranks end with the same weights, recompute=all equals recompute=none bit for bit under the same torchrun
job shape (BatchNorm statistics are per rank, so a single process cannot be the reference), and every rank recomputes."""

import json
import socket
import subprocess
import sys
import textwrap

import pytest
from helpers import SUBPROCESS_TIMEOUT_S

# Each rank trains twice in one torchrun job (none, then all: 2 steps each, no set-up estimate) and writes what it ended with.
WORKER = textwrap.dedent(
    """
    import hashlib, json, os, sys
    from ultralytics import YOLO
    from ultralytics.utils.torch_utils import unwrap_model
    from yolo_ckpt import CheckpointDetectionTrainer, count_recomputations

    data, project = sys.argv[1:3]
    digest = lambda tensors: hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes() for t in tensors)).hexdigest()
    for recompute in ("none", "all"):
        m = YOLO("yolo11n.yaml")
        with count_recomputations() as counter:
            m.train(data=data, trainer=CheckpointDetectionTrainer, project=project, name=recompute, epochs=1, batch=2,
                    nbs=2, imgsz=64, workers=0, device="cpu", plots=False, val=False, seed=0, exist_ok=True,
                    recompute=recompute, fraction=0.5, estimate=False)
        t, model = m.trainer, unwrap_model(m.trainer.model)
        out = dict(weights=digest(model.parameters()), state=digest(model.state_dict().values()),
                   ema=digest(t.ema.ema.state_dict().values()), world_size=t.world_size, steps=t.ema.updates,
                   layer0=counter.per_layer[0], layers=len(t.policy.indices))
        with open(os.path.join(project, f"{recompute}-rank{os.environ['RANK']}.json"), "w") as f:
            json.dump(out, f)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_node_torchrun_on_cpu(synthetic, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    rendezvous = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                  "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "yolo-ckpt-test"]
    nodes = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *rendezvous, "--node_rank", str(rank),
                          str(script), synthetic(), str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)
    ]
    logs = [node.communicate(timeout=SUBPROCESS_TIMEOUT_S)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    runs = {(p, r): json.loads((tmp_path / f"{p}-rank{r}.json").read_text()) for p in ("none", "all") for r in (0, 1)}
    for rank in (0, 1):
        none, ckpt = runs["none", rank], runs["all", rank]
        # fraction=0.5 of the 8 images, 1 per rank a step
        assert none["world_size"] == ckpt["world_size"] == 2 and none["steps"] == ckpt["steps"] == 2
        assert (ckpt["weights"], ckpt["state"], ckpt["ema"]) == (none["weights"], none["state"], none["ema"])
        assert none["layers"] == none["layer0"] == 0 and ckpt["layers"] >= 8
        assert ckpt["layer0"] == 2 + (rank == 0)  # once a step on every rank, plus the run report's probe on rank 0
    assert runs["all", 0]["weights"] == runs["all", 1]["weights"]  # DDP kept the ranks in step
