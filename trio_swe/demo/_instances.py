"""The demo instances: tiny Python projects with a real bug, tests, a gold fix and a script.

Each script is what the scripted policy "says" turn after turn to the bash agent. Some fix the
bug (reward 1), some do not (reward 0): a wrong fix, giving up, editing the tests instead of the
code (the grader runs its own copy of the tests, so that earns nothing), and one that runs a
command longer than the agent's budget (exit code -1, status ``truncated``).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from ._policy_server import ScriptedCompletion

__all__ = ["DEMO_INSTANCES", "DemoInstance"]

_RUNNER = """

if __name__ == "__main__":
    for _name, _fn in sorted(globals().items()):
        if _name.startswith("test_") and callable(_fn):
            _fn()
    print("all tests passed")
"""


class DemoInstance(msgspec.Struct, frozen=True, kw_only=True):
    """One demo task.

    Attributes:
        instance_id: its id.
        problem_statement: the issue text.
        files: the buggy repository (path -> text), tests included.
        test_file: the repository's test file; the grader runs its own copy of it.
        fixed: the files the gold fix changes (path -> fixed text).
        script: the scripted policy's completions, turn by turn.
        expected_reward: what the episode earns when the script plays out.
        times_out: the script overruns any small agent budget.
    """

    instance_id: str
    problem_statement: str
    files: Mapping[str, str]
    test_file: str
    fixed: Mapping[str, str]
    script: tuple[str | ScriptedCompletion, ...]
    expected_reward: float
    times_out: bool = False

    @property
    def test_source(self) -> str:
        """The graded tests (the repository's test file as first committed)."""
        return self.files[self.test_file]


def _bash(text: str, command: str) -> str:
    return f"{text}\n```bash\n{command}\n```"


_SUBMIT = _bash("Done.", "submit")

_CALC = '''def add(a, b):
    """Return the sum of a and b."""
    return a - b


def mul(a, b):
    """Return the product of a and b."""
    return a * b
'''

_WORDS = '''def reverse_words(text):
    """Return the words of text in reverse order, joined by single spaces."""
    words = text.split()
    return " ".join(words[len(words) - 1 : 0 : -1])
'''

_WORDS_FIXED = '''def reverse_words(text):
    """Return the words of text in reverse order, joined by single spaces."""
    return " ".join(reversed(text.split()))
'''

_STACK = '''class Stack:
    """A last-in, first-out stack."""

    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        """Remove and return the most recently pushed item."""
        return self._items.pop(0)

    def __len__(self):
        return len(self._items)
'''

_CLAMP = '''def clamp(x, lo, hi):
    """Limit x to the closed interval [lo, hi]."""
    return max(lo, min(x, lo))
'''

_LEAP = '''def is_leap(year):
    """True for leap years of the Gregorian calendar."""
    return year % 4 == 0 and year % 100 != 0
'''

_MEDIAN = '''def median(values):
    """The median of a non-empty list of numbers."""
    s = sorted(values)
    n = len(s)
    return s[n // 2]
'''

_MEDIAN_FIXED = '''def median(values):
    """The median of a non-empty list of numbers."""
    s = sorted(values)
    n = len(s)
    if n % 2:
        return s[n // 2]
    return (s[n // 2 - 1] + s[n // 2]) / 2
'''

_FIZZ = '''def fizzbuzz(n):
    """'Fizz' for multiples of 3, 'Buzz' of 5, 'FizzBuzz' of both, else str(n)."""
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    if n % 15 == 0:
        return "FizzBuzz"
    return str(n)
'''

_FIZZ_FIXED = '''def fizzbuzz(n):
    """'Fizz' for multiples of 3, 'Buzz' of 5, 'FizzBuzz' of both, else str(n)."""
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)
'''

_GREET = '''def greet(name):
    """A greeting for name."""
    return "Hello, " + name + "?"
'''


def _tests(body: str) -> str:
    return body.strip() + "\n" + _RUNNER


DEMO_INSTANCES: tuple[DemoInstance, ...] = (
    DemoInstance(
        instance_id="demo__calc-1",
        problem_statement="calc.add(2, 3) returns -1 instead of 5: add subtracts its arguments.",
        files={
            "calc.py": _CALC,
            "test_calc.py": _tests(
                "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
                "    assert add(-1, 1) == 0\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n"
            ),
        },
        test_file="test_calc.py",
        fixed={"calc.py": _CALC.replace("return a - b", "return a + b")},
        script=(
            _bash("Let me read the module first.", "cat calc.py"),
            _bash("`add` subtracts; it must add.", "sed -i 's/return a - b/return a + b/' calc.py"),
            _bash("Now the tests.", "python3 test_calc.py"),
            _bash("The tests pass.", "submit"),
        ),
        expected_reward=1.0,
    ),
    DemoInstance(
        instance_id="demo__words-1",
        problem_statement=('words.reverse_words("a b c") returns "c b": the first word is lost.'),
        files={
            "words.py": _WORDS,
            "test_words.py": _tests(
                "from words import reverse_words\n\n\ndef test_three():\n"
                '    assert reverse_words("a b c") == "c b a"\n\n\ndef test_one():\n'
                '    assert reverse_words("solo") == "solo"\n'
            ),
        },
        test_file="test_words.py",
        fixed={"words.py": _WORDS_FIXED},
        script=(
            _bash(
                "The slice stops before index 0. Rewrite the function.",
                f"cat > words.py <<'EOF'\n{_WORDS_FIXED}EOF",
            ),
            _bash("Check.", "python3 test_words.py"),
            _SUBMIT,
        ),
        expected_reward=1.0,
    ),
    DemoInstance(
        instance_id="demo__stack-1",
        problem_statement="Stack.pop() returns the oldest item instead of the newest one.",
        files={
            "stack.py": _STACK,
            "test_stack.py": _tests(
                "from stack import Stack\n\n\ndef test_lifo():\n    s = Stack()\n"
                "    for i in (1, 2, 3):\n        s.push(i)\n    assert s.pop() == 3\n"
                "    assert len(s) == 2\n    assert s.pop() == 2\n"
            ),
        },
        test_file="test_stack.py",
        fixed={"stack.py": _STACK.replace("self._items.pop(0)", "self._items.pop()")},
        script=(
            _bash(
                "Return the last item instead.",
                "sed -i 's/return self._items.pop(0)/return self._items[-1]/' stack.py",
            ),
            _bash("That should do it (a wrong fix: nothing is removed).", "submit"),
        ),
        expected_reward=0.0,
    ),
    DemoInstance(
        instance_id="demo__clamp-1",
        problem_statement="clamp(5, 0, 10) returns 0; values inside the interval must not change.",
        files={
            "clampx.py": _CLAMP,
            "test_clampx.py": _tests(
                "from clampx import clamp\n\n\ndef test_inside():\n    assert clamp(5, 0, 10) == 5\n\n\n"
                "def test_edges():\n    assert clamp(-3, 0, 10) == 0\n    assert clamp(12, 0, 10) == 10\n"
            ),
        },
        test_file="test_clampx.py",
        fixed={"clampx.py": _CLAMP.replace("min(x, lo)", "min(x, hi)")},
        script=(
            _bash("Look at the code.", "grep -n 'return' clampx.py"),
            _bash(
                "The upper bound uses lo. Patch it with Python.",
                "python3 - <<'EOF'\nimport pathlib\np = pathlib.Path('clampx.py')\n"
                "p.write_text(p.read_text().replace('min(x, lo)', 'min(x, hi)'))\nEOF",
            ),
            _bash("Run the tests.", "python3 test_clampx.py && git diff --stat"),
            _SUBMIT,
        ),
        expected_reward=1.0,
    ),
    DemoInstance(
        instance_id="demo__leap-1",
        problem_statement="is_leap(2000) is False, but 2000 was a leap year (divisible by 400).",
        files={
            "leap.py": _LEAP,
            "test_leap.py": _tests(
                "from leap import is_leap\n\n\ndef test_rules():\n    assert is_leap(2024)\n"
                "    assert not is_leap(1900)\n    assert is_leap(2000)\n"
            ),
        },
        test_file="test_leap.py",
        fixed={
            "leap.py": _LEAP.replace(
                "return year % 4 == 0 and year % 100 != 0",
                "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
            )
        },
        script=(
            _bash("Let me look.", "cat leap.py"),
            _bash("This looks right to me; giving up.", "submit"),
        ),
        expected_reward=0.0,
    ),
    DemoInstance(
        instance_id="demo__median-1",
        problem_statement="median([1, 2, 3, 4]) returns 3; for an even count it must be 2.5.",
        files={
            "stats.py": _MEDIAN,
            "test_stats.py": _tests(
                "from stats import median\n\n\ndef test_odd():\n    assert median([3, 1, 2]) == 2\n\n\n"
                "def test_even():\n    assert median([4, 1, 3, 2]) == 2.5\n"
            ),
        },
        test_file="test_stats.py",
        fixed={"stats.py": _MEDIAN_FIXED},
        script=(
            "The even case needs the mean of the two middle values. (No command here: this "
            "turn is ill-formed.)",
            _bash("Rewrite the function.", f"cat > stats.py <<'EOF'\n{_MEDIAN_FIXED}EOF"),
            _bash("Test.", "python3 test_stats.py"),
            _SUBMIT,
        ),
        expected_reward=1.0,
    ),
    DemoInstance(
        instance_id="demo__fizz-1",
        problem_statement='fizzbuzz(15) returns "Fizz"; it must return "FizzBuzz".',
        files={
            "fizz.py": _FIZZ,
            "test_fizz.py": _tests(
                "from fizz import fizzbuzz\n\n\ndef test_fizzbuzz():\n"
                '    assert fizzbuzz(3) == "Fizz"\n    assert fizzbuzz(5) == "Buzz"\n'
                '    assert fizzbuzz(15) == "FizzBuzz"\n    assert fizzbuzz(7) == "7"\n'
            ),
        },
        test_file="test_fizz.py",
        fixed={"fizz.py": _FIZZ_FIXED},
        script=(
            _bash(
                "Make the test agree with the code instead (cheating: the grader has its own "
                "copy of the tests).",
                'sed -i \'s/fizzbuzz(15) == "FizzBuzz"/fizzbuzz(15) == "Fizz"/\' test_fizz.py',
            ),
            _bash("Tests pass now.", "python3 test_fizz.py"),
            _SUBMIT,
        ),
        expected_reward=0.0,
    ),
    DemoInstance(
        instance_id="demo__greet-1",
        problem_statement='greet("Ada") returns "Hello, Ada?"; it must return "Hello, Ada!".',
        files={
            "greet.py": _GREET,
            "test_greet.py": _tests(
                'from greet import greet\n\n\ndef test_greet():\n    assert greet("Ada") == "Hello, Ada!"\n'
            ),
        },
        test_file="test_greet.py",
        fixed={"greet.py": _GREET.replace('"?"', '"!"')},
        script=(
            # Repeated: a CLI whose shell tool hands control back early (Codex yields after
            # 30 s) is sent back to it, so the budget is overrun with every agent. Not a bare
            # `sleep`: Qwen Code 0.15 refuses a command that starts with `sleep N` (N >= 2) at
            # once, and 458 refused turns filled a 64k context in 46 s, before the budget.
            ScriptedCompletion(
                _bash(
                    "First, a very long investigation.",
                    "python3 -c 'import time; time.sleep(600)'",
                ),
                repeat=True,
            ),
            _bash("Fix the punctuation.", 'sed -i \'s/"?"/"!"/\' greet.py'),
            _SUBMIT,
        ),
        expected_reward=0.0,
        times_out=True,
    ),
)
