"""Old path of :mod:`trajectory_ensemble_node.replay.bags`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..replay.bags import (
    BAG_VERSION, BUNDLED_BAG, BagError, BagInfo, BagRecorder, BagTopic, CANDIDATES_TYPE, CUSTOM_TYPES,
    DEMONSTRATION_BAG, DEMO_FRAMES_PER_SCENE, DEMO_FRAME_ID, DEMO_IMAGE_TOPIC, DEMO_INSTRUCTION_TOPIC,
    DEMO_JOINT_NAMES, DEMO_REFERENCE_TOPIC, DEMO_SCENE_OFFSETS, DEMO_SCENE_PERIOD_S, DEMO_START_NS,
    DEMO_STATE_TOPIC, IMAGE_TYPE, InterfaceDefinitionError, JOINT_TRAJECTORY_TYPE, MSGS_PACKAGE,
    REFERENCE_TOPIC_KEY, SCENES_KEY, SIDES_KEY, STATE_TYPE, STORAGES, STRING_TYPE, TRAJECTORY_TYPE,
    TrajectoryEnsembleError, add_arguments, bag_info, candidates_array, demonstrated_side, deserialize, image_msg,
    image_rgb, iter_raw, joint_state_msg, joint_trajectory_msg, main, make_demo_bag, make_header,
    msg_definition_dirs, read_messages, run, serialize, stamp_ns, string_msg, toy_scene_seeds, trajectory_array,
    typestore,
)

__all__ = [
    "BAG_VERSION", "BUNDLED_BAG", "BagError", "BagInfo", "BagRecorder", "BagTopic", "CANDIDATES_TYPE",
    "CUSTOM_TYPES", "DEMONSTRATION_BAG", "DEMO_FRAMES_PER_SCENE", "DEMO_FRAME_ID", "DEMO_IMAGE_TOPIC",
    "DEMO_INSTRUCTION_TOPIC", "DEMO_JOINT_NAMES", "DEMO_REFERENCE_TOPIC", "DEMO_SCENE_OFFSETS",
    "DEMO_SCENE_PERIOD_S", "DEMO_START_NS", "DEMO_STATE_TOPIC", "IMAGE_TYPE", "InterfaceDefinitionError",
    "JOINT_TRAJECTORY_TYPE", "MSGS_PACKAGE", "REFERENCE_TOPIC_KEY", "SCENES_KEY", "SIDES_KEY", "STATE_TYPE",
    "STORAGES", "STRING_TYPE", "TRAJECTORY_TYPE", "TrajectoryEnsembleError", "add_arguments", "bag_info",
    "candidates_array", "demonstrated_side", "deserialize", "image_msg", "image_rgb", "iter_raw", "joint_state_msg",
    "joint_trajectory_msg", "main", "make_demo_bag", "make_header", "msg_definition_dirs", "read_messages", "run",
    "serialize", "stamp_ns", "string_msg", "toy_scene_seeds", "trajectory_array", "typestore",
]

if __name__ == "__main__":
    import sys

    sys.exit(main())
