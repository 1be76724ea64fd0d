"""A model on fuel ops trained under DistributedDataParallel (gloo, 2 processes, 127.0.0.1 only).

Each rank takes half of one batch; DDP averages the gradients. With a per-rank mean loss over equal halves
that average is exactly the gradient of the mean loss over the whole batch, which a single process
computes here for comparison (float64; only the summation order differs).
"""
import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import torch
import torch.distributed as dist


WORLD = 2
BATCH = 8
TIMEOUT_S = 120

# Shared by the workers and the single-process reference: the model, its weights and the batch.
MODEL = textwrap.dedent("""
    import torch
    import fuel_torch.nn

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down = fuel_torch.nn.Conv2d(2, 6, 3, stride=2, padding=1, groups=2)
            self.up = fuel_torch.nn.ConvTranspose2d(6, 2, 3, stride=2, padding=1, output_padding=1)
            self.gain = torch.nn.Parameter(torch.linspace(0.5, 1.5, 2 * 8 * 8).reshape(2, 8, 8))

        def forward(self, x):
            h = self.down(x)
            h = torch.ops.fuel.maximum(h, torch.ops.fuel.mul(h, torch.full_like(h, 0.1)))
            y = self.up(h)
            return torch.ops.fuel.mul(y, self.gain.expand_as(y).contiguous())

    def build():
        torch.manual_seed(0)
        return Net().double()

    def batch(size):
        return torch.randn(size, 2, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def loss(model, x):
        diff = torch.ops.fuel.sub(model(x), x)
        return torch.ops.fuel.mul(diff, diff).mean()
""")

WORKER = MODEL + textwrap.dedent("""
    import os
    import sys
    import time
    from datetime import timedelta
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world, port, batch_size, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    model = DistributedDataParallel(build())
    local = batch(batch_size).chunk(world)[rank].clone()  # a chunk is an offset view: fuel ops take none
    loss(model, local).backward()
    torch.save({name: p.grad for name, p in model.module.named_parameters()}, out)
    # Teardown in lockstep: a rank whose peer already closed its gloo pair, or whose gloo and store
    # threads were still joinable when the interpreter's exit destroyed them, could abort ("terminate
    # called without an active exception": 1 run in 4 on a Zen 5, and once with a barrier alone, under
    # load). Both ranks destroy their process group before either exits, and exit without running
    # destructors; the gradients are on disk by then.
    dist.barrier()
    dist.destroy_process_group()
    store.add("destroyed", 1)
    deadline = time.monotonic() + 60
    while store.add("destroyed", 0) < world and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.stdout.flush()
    os._exit(0 if store.add("destroyed", 0) == world else 3)
""")


def reference_grads():
    namespace = {}
    exec(MODEL, namespace)
    model = namespace["build"]()
    namespace["loss"](model, namespace["batch"](BATCH)).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def test_ddp_gradients_equal_the_single_process_gradients(tmp_path):
    # The parent holds the rendezvous store on a port the OS picks (port 0), so there is no free-port race;
    # everything binds to 127.0.0.1 and the workers' gloo sockets use the loopback interface.
    store = dist.TCPStore("127.0.0.1", 0, WORLD + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    outs = [tmp_path / f"rank{rank}.pt" for rank in range(WORLD)]
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(rank), str(WORLD), str(store.port), str(BATCH),
                                 str(out)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
               for rank, out in enumerate(outs)]
    try:
        logs = [worker.communicate(timeout=TIMEOUT_S)[0].decode() for worker in workers]
    finally:
        for worker in workers:
            worker.kill()  # no-op once they exited; bounds the test if one hangs
    assert [w.returncode for w in workers] == [0] * WORLD, "\n".join(logs)
    expected = reference_grads()
    per_rank = [torch.load(out) for out in outs]
    assert set(per_rank[0]) == set(expected) == {"gain", "down.weight", "down.bias", "up.weight", "up.bias"}
    for name, grad in expected.items():
        for rank, grads in enumerate(per_rank):
            torch.testing.assert_close(grads[name], grad, rtol=1e-12, atol=1e-14, msg=f"rank {rank}: {name}")
    # A rank's own half-batch gradient is not the answer: the comparison above needs DDP's all-reduce.
    namespace = {}
    exec(MODEL, namespace)
    alone = namespace["build"]()
    namespace["loss"](alone, namespace["batch"](BATCH).chunk(WORLD)[0].clone()).backward()
    assert not torch.allclose(alone.gain.grad, expected["gain"])
    del store
