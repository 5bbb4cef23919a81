"""The smoke's judgement of an answer's text (deployer/host/module_utils/answer_shape.py): a broken quantized MoE
kernel answers "foss foss foss ..." with /health 200 (vllm#40357); a real answer, in any language, passes."""
import pytest

from deployer.host.module_utils.answer_shape import answer_text, degenerate

GOOD = [
    "Speculative decoding drafts several tokens with a small model and verifies them with the large one in one step.",
    "Speculative decoding: a drafter proposes, the target verifies.",
    "It is a way to decode faster.",
    "Yes.",
    "投机解码是一种用小模型预先生成多个候选词、再由大模型一次性验证的加速方法。",
    "The the answer is that speculative decoding is fast.",       # one stutter is language
    "ok",
]

BAD = [
    ("foss foss foss foss foss foss foss foss foss foss", "'foss' repeated (10 words)"),
    ("Foss, foss. FOSS foss!", "'foss' repeated (4 words)"),
    ("foss bar foss bar foss bar foss bar", "'foss bar' repeated (8 words)"),
    ("!!!!!!!!!!!!!!!!", "'!' repeated (16 characters)"),
    ("哈哈哈哈哈哈哈哈哈哈", "'哈' repeated (10 characters)"),
    ("\ufffd\ufffd\ufffd a \ufffd\ufffd", "5 of its 6 characters are U+FFFD"),
    ("the the the the the cat the the the the", "'the' is 9 of its 10 words"),
    ("   ", "the answer is empty"),
]


@pytest.mark.parametrize("text", GOOD)
def test_language_passes(text):
    assert degenerate(text) == ""


@pytest.mark.parametrize("text,why", BAD)
def test_the_shapes_of_a_broken_kernel_are_named_with_their_evidence(text, why):
    assert why in degenerate(text)


def test_the_text_is_the_content_without_think_blocks_else_the_reasoning():
    assert answer_text({"content": "Hello there."}) == ("Hello there.", False)
    assert answer_text({"content": None, "reasoning": " The user asks. "}) == ("The user asks.", True)
    assert answer_text({"content": "", "reasoning_content": "SGLang's field"}) == ("SGLang's field", True)
    assert answer_text({"content": "<think>all thought, no answer</think>\n"}) == ("", False)
    assert answer_text({"content": "<think>cut off by max_tokens"}) == ("", False)
    assert answer_text({"content": "<think>x</think> The answer."}) == ("The answer.", False)
    assert answer_text(None) == ("", False) and answer_text({"content": 7}) == ("", False)
    # empty once the reasoning is stripped, and no reasoning field: that is degenerate too
    assert degenerate(answer_text({"content": "<think>hmm</think>"})[0]).startswith("the answer is empty")
