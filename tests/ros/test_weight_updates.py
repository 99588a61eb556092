"""ros/weight_updates.py: update paths stay inside weights_dir and are safetensors."""

from __future__ import annotations

import pytest

from trajectory_ensemble_node.errors import ErrorCode, WeightsPathError
from trajectory_ensemble_node.ros.weight_updates import resolve_update_path


def test_update_paths_stay_inside_weights_dir_and_are_safetensors(tmp_path):
    root = tmp_path / "weights"
    (root / "ckpt" / "transformer").mkdir(parents=True)
    good = root / "w.safetensors"
    good.write_bytes(b"x")
    (root / "ckpt" / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"x")
    (root / "w.pt").write_bytes(b"x")
    outside = tmp_path / "evil.safetensors"
    outside.write_bytes(b"x")
    (root / "link.safetensors").symlink_to(outside)
    assert resolve_update_path(str(root), "w.safetensors") == good.resolve()
    assert resolve_update_path(str(root), str(good)) == good.resolve()
    assert resolve_update_path(str(root), "ckpt").name == "diffusion_pytorch_model.safetensors"
    for path, message in (("../evil.safetensors", "'..'"), (str(outside), "outside weights_dir"),
                          ("link.safetensors", "outside weights_dir"), ("w.pt", "pickle"),
                          ("missing.safetensors", "does not exist"), ("", "empty")):
        with pytest.raises(WeightsPathError, match=message) as info:
            resolve_update_path(str(root), path)
        assert info.value.code == ErrorCode.WEIGHTS_REJECTED
    with pytest.raises(WeightsPathError, match="weights_dir is not set"):
        resolve_update_path("", "w.safetensors")
