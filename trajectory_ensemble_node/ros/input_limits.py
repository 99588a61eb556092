"""Input size limits, checked before any work: instruction length (characters, then tokens) and image size.

Why: the prefix encode costs about quadratically in the instruction's length (1,000 characters 0.28 s, 16,000
characters 5.4 s on a small CPU), and one 1 MB instruction once held the engine thread for minutes. The character
check is O(1), so it runs first and bounds the tokenizer's work; the token count then runs on at most
``max_instruction_chars`` characters, through the pipeline's own tokenizer.

A goal over a limit is *accepted and aborted at once* with its error code (``INSTRUCTION_TOO_LONG``), not rejected
in the goal callback: a ``GoalResponse.REJECT`` reaches the client as a bare ``accepted=False``, with no code and no
message, so the client could not learn why. The abort happens in the accept callback, before any observation or
model work, within milliseconds.

Images are checked on arrival, from the message's header fields and ``len(data)``, before any conversion. Nothing
here imports rclpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ImageTooLargeError, InstructionTooLongError

TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class InputLimits:
    """The limits, from the node's parameters.

    Args:
        max_instruction_chars (`int`): Most characters in an instruction (goal or ``~/instruction``).
        max_instruction_tokens (`int`): Most tokens in it, by the pipeline's tokenizer (0 = not checked).
        max_image_bytes (`int`): Most bytes of ``data`` in one image message.
        max_image_pixels (`int`): Most ``width * height`` in one image message.
    """

    max_instruction_chars: int
    max_instruction_tokens: int
    max_image_bytes: int
    max_image_pixels: int


def token_counter(pipe: Any) -> TokenCounter | None:
    """A function counting an instruction's tokens with the pipeline's text tokenizer, or ``None`` if it has none.

    Args:
        pipe (`Any`): The loaded pipeline (``text_tokenizer``, else ``tokenizer``).
    """
    tokenizer = getattr(pipe, "text_tokenizer", None) or getattr(pipe, "tokenizer", None)
    if tokenizer is None:
        return None

    def count(text: str) -> int:
        # No special tokens and no chat template: the limit is on what the sender wrote.
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


def check_instruction(text: str, limits: InputLimits, count_tokens: TokenCounter | None, *,
                      source: str = "instruction") -> None:
    """Refuse an instruction above the limits.

    Args:
        text (`str`): The instruction.
        limits (`InputLimits`): The limits.
        count_tokens (`TokenCounter`, *optional*): Token counter (see :func:`token_counter`).
        source (`str`): How the message names the input (``instruction``, ``~/instruction``).

    Raises:
        InstructionTooLongError: too many characters (checked first, without tokenizing) or tokens.
    """
    if len(text) > limits.max_instruction_chars:
        raise InstructionTooLongError(
            f"{source} has {len(text)} characters, above max_instruction_chars={limits.max_instruction_chars} "
            f"(starts {text[:40]!r}); nothing was run"
        )
    if count_tokens is not None and limits.max_instruction_tokens > 0:
        tokens = count_tokens(text)
        if tokens > limits.max_instruction_tokens:
            raise InstructionTooLongError(
                f"{source} has {tokens} tokens, above max_instruction_tokens={limits.max_instruction_tokens} "
                f"(starts {text[:40]!r}); nothing was run"
            )


def check_image_size(msg: Any, limits: InputLimits) -> None:
    """Refuse an image message above the limits, from its fields alone (nothing is converted or copied).

    Args:
        msg (`sensor_msgs.msg.Image`): The message.
        limits (`InputLimits`): The limits.

    Raises:
        ImageTooLargeError: more bytes than ``max_image_bytes`` or more pixels than ``max_image_pixels``.
    """
    size = len(msg.data)
    if size > limits.max_image_bytes:
        raise ImageTooLargeError(
            f"image has {size} bytes, above max_image_bytes={limits.max_image_bytes} ({msg.width}x{msg.height} "
            f"{msg.encoding!r})"
        )
    pixels = int(msg.width) * int(msg.height)
    if pixels > limits.max_image_pixels:
        raise ImageTooLargeError(
            f"image is {msg.width}x{msg.height} = {pixels} pixels, above max_image_pixels={limits.max_image_pixels}"
        )
