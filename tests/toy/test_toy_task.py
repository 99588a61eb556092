"""The toy obstacle task: deterministic scenes, rendering, expert demonstrations and the task's own metrics."""

from __future__ import annotations

import numpy as np
import pytest

from trajectory_ensemble_node.toy import task


def straight(scene: task.Scene) -> np.ndarray:
    """Waypoints ``[H, 2]`` on the straight line from the robot to the target."""
    t = np.arange(1, task.HORIZON + 1)[:, None] / task.HORIZON
    return scene.robot + t * (scene.target - scene.robot)


def test_scenes_are_a_pure_function_of_the_seed():
    a, b = task.make_scene(7), task.make_scene(7)
    for field in ("robot", "target", "obstacle", "start"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert a.radius == b.radius
    assert not np.array_equal(task.make_scene(8).robot, a.robot)
    assert np.array_equal(task.render(a), task.render(b))
    assert np.array_equal(task.expert_path(a, 1), task.expert_path(b, 1))


def test_scenes_vary_and_stay_in_the_frame():
    scenes = [task.make_scene(s) for s in range(200)]
    radii = [s.radius for s in scenes]
    assert max(radii) - min(radii) > 0.08
    assert np.ptp([s.robot[1] for s in scenes]) > 0.6
    for scene in scenes[:50]:
        for side in (1, -1):
            assert np.abs(task.expert_path(scene, side)).max() < 1.0


def test_heldout_seeds_are_outside_the_training_range():
    held = task.heldout_scenes(5, seed=3)
    assert [s.seed for s in held] == [task.HELDOUT_SEED_BASE + 3 + i for i in range(5)]
    # train-toy uses seeds TRAIN_SEED_BASE .. TRAIN_SEED_BASE + scenes - 1; any realistic --scenes stays below.
    assert task.HELDOUT_SEED_BASE - task.TRAIN_SEED_BASE >= 100_000


def test_render_shape_dtype_and_colours():
    scene = task.make_scene(3)
    image = task.render(scene)
    assert image.shape == (task.IMAGE_SIZE, task.IMAGE_SIZE, 3) and image.dtype == np.uint8
    col, row = task.to_pixels(scene.obstacle).astype(int)
    assert tuple(image[row, col]) == task.OBSTACLE_COLOR
    col, row = task.to_pixels(scene.target).astype(int)
    assert tuple(image[row, col]) == task.TARGET_COLOR
    col, row = task.to_pixels(scene.robot).astype(int)
    assert tuple(image[row, col]) == task.ROBOT_COLOR
    floor = np.round(task.floor_color()).astype(np.uint8)
    assert tuple(image[1, 1]) == tuple(floor[1, 1])
    # The floor encodes position: red rises to the right, green upwards.
    assert image[1, -2, 0] > image[1, 1, 0] + 40 and image[1, 1, 1] > image[-2, 1, 1] + 40
    moved = task.render(scene, robot=np.array([0.0, 0.9]))
    col, row = task.to_pixels(np.array([0.0, 0.9])).astype(int)
    assert tuple(moved[row, col]) == task.ROBOT_COLOR


def test_render_clip_follows_the_waypoints():
    scene = task.make_scene(4)
    path = task.expert_path(scene, -1)
    clip = task.render_clip(scene, path)
    assert len(clip) == task.HORIZON + 1
    assert np.array_equal(clip[0], task.render(scene))
    col, row = task.to_pixels(path[-1]).astype(int)
    assert tuple(clip[-1][row, col]) == task.ROBOT_COLOR


@pytest.mark.parametrize("seed", range(10))
def test_straight_line_collides_and_both_expert_detours_do_not(seed):
    scene = task.make_scene(seed)
    assert task.collides(scene, straight(scene))
    assert task.expert_sides(scene) == (1, -1), "initial scenes are bimodal"
    above, below = task.expert_path(scene, 1), task.expert_path(scene, -1)
    for path, side in ((above, 1), (below, -1)):
        assert not task.collides(scene, path)
        assert task.clearance(scene, path) == pytest.approx(task.EXPERT_CLEARANCE, abs=1e-6)
        assert task.side(scene, path) == side
        assert task.final_error(scene, path) < 1e-9
    # The mean of the two detours runs through the obstacle: what `mean` does to a bimodal set.
    assert task.collides(scene, (above + below) / 2)


def test_collision_checks_segments_not_only_vertices():
    scene = task.Scene(robot=np.array([-0.5, 0.0]), target=np.array([0.5, 0.0]), obstacle=np.array([0.0, 0.0]),
                       radius=0.2, start=np.array([-0.5, 0.0]), seed=-1)
    # Every vertex is far from the disk, but the segment between the last two crosses it.
    hop = np.array([[-0.5, 0.5], [-0.4, 0.0], [0.4, 0.0], [0.5, 0.0]])
    assert min(np.linalg.norm(hop - scene.obstacle, axis=1)) - scene.radius > 0.19
    assert task.clearance(scene, hop) == pytest.approx(-0.2)
    assert task.collides(scene, hop)
    # Clearance threshold: just inside and just outside COLLISION_CLEARANCE.
    near = task.COLLISION_CLEARANCE * 0.5 + scene.radius
    far = task.COLLISION_CLEARANCE * 1.5 + scene.radius
    assert task.collides(scene, np.array([[-0.5, near], [0.5, near], [0.5, 0.0]]))
    assert not task.collides(scene, np.array([[-0.5, far], [0.5, far], [0.5, 0.0]]))
    assert task.final_error(scene, np.array([[0.2, 0.0], [0.5, 0.3]])) == pytest.approx(0.3)


def test_side_and_mode_agreement():
    scene = task.make_scene(11)
    above, below = task.expert_path(scene, 1), task.expert_path(scene, -1)
    after_above = task.replan_scene(scene, above)
    assert np.array_equal(after_above.robot, above[task.REPLAN_AFTER - 1])
    assert np.array_equal(after_above.start, scene.start)
    # From half-way above, the expert continues above: it is the only side it offers there.
    assert task.expert_sides(after_above) == (1,)
    continue_above = task.expert_path(after_above, 1)
    assert task.mode_agreement(scene, above, continue_above)
    # Switching to a path that crosses below the obstacle disagrees.
    crossing = np.linspace(after_above.robot, scene.obstacle + np.array([0.0, -scene.radius - 0.1]), task.HORIZON)
    crossing[-1] = scene.target
    assert not task.mode_agreement(scene, above, crossing)
    assert task.side(scene, below) == -1


def test_expert_continuation_is_time_consistent_and_stays_at_the_target():
    scene = task.make_scene(5)
    for side in (1, -1):
        path = task.expert_path(scene, side)
        assert np.array_equal(task.expert_continuation(scene, side, 0.0), path)
        # The chunk planned after executing s actions repeats the rest of the one being executed, then stays.
        later = task.expert_continuation(scene, side, float(task.REPLAN_AFTER))
        assert np.allclose(later[: task.HORIZON - task.REPLAN_AFTER], path[task.REPLAN_AFTER:])
        assert np.allclose(later[task.HORIZON - task.REPLAN_AFTER:], scene.target)
        assert np.allclose(task.expert_continuation(scene, side, 9.5), scene.target)


def test_a_chunk_planned_past_the_obstacle_has_no_side():
    scene = task.make_scene(task.HELDOUT_SEED_BASE + 3)
    axis = (scene.target - scene.start) / np.linalg.norm(scene.target - scene.start)
    normal = np.array([-axis[1], axis[0]])
    stay = np.repeat(scene.target[None], task.HORIZON, axis=0)
    # Hovering at the target on either side of the obstacle's axis line (which passes within BIMODAL_BAND of the
    # target): side() flips, passing_side() says "passed" for both.
    on_line = scene.obstacle + np.dot(scene.target - scene.obstacle, axis) * axis
    above, below = on_line + 0.02 * normal, on_line - 0.02 * normal
    assert np.linalg.norm(above - scene.target) < task.TARGET_RADIUS + task.BIMODAL_BAND
    hover = [np.repeat(p[None], task.HORIZON, axis=0) for p in (above, below)]
    assert task.side(scene, hover[0], start=above) != task.side(scene, hover[1], start=below)
    assert task.passing_side(scene, hover[0], start=above) == task.passing_side(scene, hover[1], start=below) == 0
    # Beside the obstacle and before it, the side is the polyline's.
    for side_sign in (1, -1):
        path = task.expert_path(scene, side_sign)
        assert task.passing_side(scene, path, start=scene.start) == task.side(scene, path) == side_sign
        beside = scene.obstacle + side_sign * (scene.radius + 0.1) * normal
        assert task.passing_side(scene, stay, start=beside) == side_sign
