"""Rotation helpers for the ``pose_gripper`` reducer: 6D encoding, Gram-Schmidt, projection onto SO(3).

The 6D encoding (Zhou et al., "On the Continuity of Rotation Representations in Neural Networks", CVPR 2019) is the
first two columns of a rotation matrix, concatenated: ``[R[:, 0], R[:, 1]]``. Storing the first two *rows*
concatenated instead gives identical reducer output, because every step below commutes with transposition. The
interleaved layout (the 3x2 block flattened row-major) is a different encoding and is not supported.
"""

from __future__ import annotations

import torch

# Below this norm a 6D column is treated as zero instead of being divided by ~0 (which would make NaN).
_NORM_EPS = 1e-12


def rotation_from_6d(r6: torch.Tensor) -> torch.Tensor:
    """Rebuild rotation matrices from 6D encodings by Gram-Schmidt.

    Args:
        r6 (`torch.Tensor` of shape `[..., 6]`): ``[a1, a2]``, the (possibly non-orthonormal) first two columns.

    Returns:
        `torch.Tensor` of shape `[..., 3, 3]`: Columns ``b1 = a1/|a1|``, ``b2`` = the part of ``a2`` orthogonal to
        ``b1``, normalized, and ``b3 = b1 x b2``. A degenerate encoding (a zero column, or parallel columns) yields a
        matrix with zero columns rather than NaN; averaged with others it simply carries less weight.
    """
    a1, a2 = r6[..., 0:3], r6[..., 3:6]
    b1 = a1 / a1.norm(dim=-1, keepdim=True).clamp_min(_NORM_EPS)
    a2 = a2 - (b1 * a2).sum(dim=-1, keepdim=True) * b1
    b2 = a2 / a2.norm(dim=-1, keepdim=True).clamp_min(_NORM_EPS)
    b3 = torch.linalg.cross(b1, b2, dim=-1)
    return torch.stack((b1, b2, b3), dim=-1)


def rotation_to_6d(rotation: torch.Tensor) -> torch.Tensor:
    """Encode rotation matrices as their first two columns.

    Args:
        rotation (`torch.Tensor` of shape `[..., 3, 3]`): Rotation matrices.

    Returns:
        `torch.Tensor` of shape `[..., 6]`: ``[R[:, 0], R[:, 1]]``.
    """
    return torch.cat((rotation[..., :, 0], rotation[..., :, 1]), dim=-1)


def project_to_so3(matrix: torch.Tensor) -> torch.Tensor:
    """The rotation nearest (in Frobenius norm) to each matrix: ``U diag(1, 1, det(U V^T)) V^T``.

    Applied to the average of rotation matrices this is their chordal L2 mean. The determinant fix turns a
    reflection into the nearest proper rotation, so the result always has ``det = +1`` (also for rank-deficient
    inputs, where the nearest rotation is not unique and the SVD's choice is returned).

    Args:
        matrix (`torch.Tensor` of shape `[..., 3, 3]`): Arbitrary real matrices; float64 is recommended.

    Returns:
        `torch.Tensor` of shape `[..., 3, 3]`: Proper rotation matrices, same dtype.
    """
    u, _, vh = torch.linalg.svd(matrix)
    det = torch.linalg.det(u @ vh)
    signs = torch.ones(matrix.shape[:-1], dtype=matrix.dtype, device=matrix.device)
    signs[..., 2] = torch.where(det < 0, -1.0, 1.0).to(matrix.dtype)
    return (u * signs.unsqueeze(-2)) @ vh
