"""FLOP counting of the benchmark's work figures, checked against closed forms on single operators."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trajectory_ensemble_lab.bench.work import Work, attention_flops, count_work


def test_a_linear_layer_counts_two_flops_per_multiply_add():
    x, weight, bias = torch.randn(10, 20), torch.randn(30, 20), torch.randn(30)
    assert count_work(lambda: F.linear(x, weight)) == Work(gemm=2 * 10 * 20 * 30)
    assert count_work(lambda: F.linear(x, weight, bias)).gemm == 2 * 10 * 20 * 30


def test_grouped_query_attention_counts_the_repeated_heads_and_causal_only_what_is_unmasked():
    q, k, v = torch.randn(2, 8, 16, 4), torch.randn(2, 2, 16, 4), torch.randn(2, 2, 16, 4)
    full = count_work(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    assert full == Work(attention=2 * 2 * 8 * 16 * 16 * (4 + 4))
    causal = count_work(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True))
    assert causal == Work(attention=2 * 2 * 8 * (16 * 17 // 2) * (4 + 4))
    # Queries over a longer key sequence (a generation block over prefix + block): every pair is scored.
    k_long, v_long = torch.randn(2, 2, 40, 4), torch.randn(2, 2, 40, 4)
    assert count_work(lambda: F.scaled_dot_product_attention(q, k_long, v_long, enable_gqa=True)).attention == (
        2 * 2 * 8 * 16 * 40 * 8)


def test_causal_pairs_follow_torch_top_left_alignment():
    # 3 queries over 5 keys, top-left aligned: rows see 1, 2, 3 keys.
    assert attention_flops((1, 1, 3, 2), (1, 1, 5, 2), (1, 1, 5, 2), is_causal=True) == 2 * 6 * 4
    # 5 queries over 3 keys: rows see 1, 2, 3, 3, 3 keys.
    assert attention_flops((1, 1, 5, 2), (1, 1, 3, 2), (1, 1, 3, 2), is_causal=True) == 2 * 12 * 4


def test_convolutions_are_their_own_kind_and_mismatched_shapes_are_named():
    work = count_work(lambda: F.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)))
    assert work.conv == 2 * (4 * 6 * 6) * (3 * 3 * 3) and work.total == work.conv
    with pytest.raises(ValueError, match="Incompatible attention shapes"):
        attention_flops((1, 6, 4, 8), (1, 4, 4, 8), (1, 4, 4, 8))
    assert Work(gemm=1, conv=2).scaled(3) == Work(gemm=3, conv=6)
    assert Work(gemm=2e9, attention=1e9).as_gflop()["total"] == pytest.approx(3.0)
