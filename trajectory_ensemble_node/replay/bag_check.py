"""Check a bag's messages before a tool acts on them: a corrupt recording is a bad bag (exit 2), not a regression.

A message that cannot be deserialized once surfaced mid-run as a ``SerdeError`` traceback and exit 1, which CI read as
a model regression. :func:`check_messages` deserializes every message of the topics a run will read, up front, before
the node is contacted, and names the first bad one by topic and index (cheap next to serving, so none is skipped).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from . import bags
from .playback import ReplayOptions, resolve_inputs


class CorruptMessageError(bags.BagError):
    """A bag message cannot be deserialized, or the bag's storage fails partway (the topic and index are named)."""


def check_messages(path: str | Path, topics: Sequence[str]) -> dict[str, int]:
    """Deserialize every message of ``topics`` in ``path``.

    Args:
        path (`str` or `Path`): A rosbag2 folder.
        topics (`Sequence[str]`): The topics the caller will read or publish.

    Returns:
        `dict[str, int]`: Messages checked per topic.

    Raises:
        CorruptMessageError: naming the bag, the topic, the message's index on that topic (0-based), its log time
            and the deserializer's reason; or the storage failing after the last good message.
        BagError: ``path`` is not a rosbag2 folder.
    """
    counts = {topic: 0 for topic in topics}
    last = "before the first message"
    messages = bags.iter_raw(path, topics)
    while True:
        try:
            topic, msgtype, log_ns, data = next(messages)
        except StopIteration:
            return counts
        except bags.BagError:
            raise
        except Exception as error:  # noqa: BLE001 - rosbags' storage readers raise several types
            raise CorruptMessageError(f"bag {path}: the storage cannot be read {last} ({type(error).__name__}: "
                                      f"{error}); the recording is damaged") from None
        try:
            bags.deserialize(data, msgtype)
        except Exception as error:  # noqa: BLE001 - SerdeError, struct.error, IndexError, ... all mean the same
            raise CorruptMessageError(
                f"bag {path}: message {counts[topic]} on {topic!r} ({msgtype}, {len(data)} bytes, logged at "
                f"{log_ns} ns) cannot be deserialized ({type(error).__name__}: {error}); the recording is damaged, "
                "nothing was sent to the node") from None
        last = f"after message {counts[topic]} on {topic!r}"
        counts[topic] += 1


def check_replay_bag(opts: ReplayOptions) -> dict[str, int]:
    """Check every message a replay of ``opts`` will read: its input topics (as :func:`.playback.resolve_inputs`
    picks them) and ``--reference-topic``.

    Raises:
        BagError: the bag is unreadable, lacks an image topic (:func:`.playback.resolve_inputs`), or its image topic
            holds no message.
        CorruptMessageError: see :func:`check_messages`.
    """
    inputs = resolve_inputs(bags.bag_info(opts.bag), opts)
    counts = check_messages(opts.bag, [*inputs, *([opts.reference_topic] if opts.reference_topic else [])])
    image_topic = next(topic for topic, (_, msgtype) in inputs.items() if msgtype == bags.IMAGE_TYPE)
    if not counts[image_topic]:
        # Declared in the metadata but never written (a recorder stopped before the first frame): no goal can be
        # scheduled, and the replay would otherwise stop on it after contacting the node.
        raise bags.BagError(f"bag {opts.bag}: the image topic {image_topic!r} holds no message; nothing to replay")
    return counts
