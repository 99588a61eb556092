"""Forward workers (``models/cosmos3/workers.py``): co-batched pieces on several threads, the same bits as on one."""

from __future__ import annotations

import threading

import pytest
import torch
from _cosmos3 import FPS, PROMPT, STEPS, candidate_spec, fresh_pipe, policy, upstream_action

from trajectory_ensemble_node.errors import InvalidSpecError
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
from trajectory_ensemble_node.models.cosmos3.workers import (
    ForwardWorkers,
    default_forward_threads,
    resolve_forward_threads,
    usable_cores,
)

BASE_SEED = 4321


def request(count: int, *, seed: int, image_seed: int, prompt: str = PROMPT, guidance: float = 3.0) -> dict:
    return dict(prompt=prompt, action=policy(seed=image_seed), num_inference_steps=STEPS, guidance_scale=guidance,
                fps=FPS, spec=candidate_spec(count), base_seed=seed)


def co_batched(model: Cosmos3ActionModel, requests: list[dict]):
    handles = [model.submit(**kwargs) for kwargs in requests]
    model.run_until_idle()
    return [handle.result() for handle in handles]


GROUPS = [
    request(1, seed=BASE_SEED, image_seed=1),
    request(1, seed=BASE_SEED + 1, image_seed=2, prompt=PROMPT + " slowly"),
    request(2, seed=BASE_SEED + 2, image_seed=3),
    request(3, seed=BASE_SEED + 3, image_seed=4, guidance=1.0),
]


@pytest.mark.parametrize("row_block_rows", [None, 1], ids=["whole-layers", "row-blocks"])
def test_co_batched_groups_on_two_threads_are_bit_identical_to_one_thread(row_block_rows):
    one = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=16, row_block_rows=row_block_rows,
                             forward_threads=1)
    two = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=16, row_block_rows=row_block_rows,
                             forward_threads=2)
    assert one.adapter.forward_workers is None and two.adapter.forward_workers.threads == 2
    alone, threaded = co_batched(one, GROUPS), co_batched(two, GROUPS)
    for a, b in zip(alone, threaded):
        assert b.metrics["co_batched_groups_max"] == len(GROUPS)
        assert torch.equal(a.candidates, b.candidates) and torch.equal(a.action, b.action)
    assert two.adapter.forward_workers.parallel_calls > 0, "the co-batched forwards never used the second thread"
    # A lone candidate has one attention run and one row block: nothing to split, and still upstream's bits.
    calls = two.adapter.forward_workers.parallel_calls
    lone = two.generate(**request(1, seed=BASE_SEED, image_seed=1))
    assert two.adapter.forward_workers.parallel_calls == calls
    assert torch.equal(lone.candidates[0], upstream_action(BASE_SEED, guidance_scale=3.0))


def test_shares_are_contiguous_cover_every_piece_and_run_off_the_caller_but_the_first():
    workers = ForwardWorkers(3)
    seen: list[tuple[tuple[int, ...], int, bool]] = []
    lock = threading.Lock()

    def work(share):
        with lock:
            seen.append((tuple(share), threading.get_ident(), torch.is_grad_enabled()))

    with torch.no_grad():
        workers.run(list(range(7)), work)
    shares = sorted(seen)
    assert [s for s, _, _ in shares] == [(0, 1, 2), (3, 4), (5, 6)]
    caller = threading.get_ident()
    assert [ident == caller for _, ident, _ in shares] == [True, False, False], "the caller runs share 0 only"
    assert not any(grad for _, _, grad in seen), "a worker's share recorded autograd history"
    assert workers.parallel_calls == 1
    # Fewer pieces than threads: one share each; one piece: the caller alone.
    seen.clear()
    with torch.no_grad():
        workers.run([9], work)
    assert [(s, ident) for s, ident, _ in seen] == [((9,), threading.get_ident())]
    workers.close()


def test_with_autograd_on_everything_runs_on_the_caller():
    # In-place writes into one buffer from several threads would race on its autograd history (RTC, training).
    workers = ForwardWorkers(2)
    idents: set[int] = set()
    workers.run([0, 1, 2, 3], lambda share: idents.add(threading.get_ident()))
    assert idents == {threading.get_ident()} and workers.parallel_calls == 0


def test_a_failing_share_is_raised_after_every_share_finished():
    workers = ForwardWorkers(2)
    finished: list[int] = []
    release = threading.Event()

    def work(share):
        if share[0] == 0:
            release.wait(5)  # the caller's share outlives the worker's failure
            finished.append(0)
        else:
            release.set()
            raise RuntimeError(f"piece {share[0]} failed")

    with torch.no_grad(), pytest.raises(RuntimeError, match="piece 2 failed"):
        workers.run([0, 1, 2, 3], work)
    assert finished == [0]
    workers.close()


def test_forward_threads_is_validated_and_auto_fills_the_cores_intra_op_threads_leave():
    assert resolve_forward_threads(None, torch.device("cpu")) == 1
    assert resolve_forward_threads(0, torch.device("cpu")) == 1
    assert resolve_forward_threads(3, torch.device("cpu")) == 3
    assert default_forward_threads(torch.device("cuda")) == 1
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert default_forward_threads(torch.device("cpu")) == max(1, min(4, usable_cores()))
        torch.set_num_threads(usable_cores())
        assert default_forward_threads(torch.device("cpu")) == 1
    finally:
        torch.set_num_threads(previous)
    with pytest.raises(InvalidSpecError, match="forward_threads must be 'auto', None or an int >= 0, got -2"):
        Cosmos3ActionModel(fresh_pipe(), forward_threads=-2)
    with pytest.raises(InvalidSpecError, match="got 'many'"):
        Cosmos3ActionModel(fresh_pipe(), forward_threads="many")
