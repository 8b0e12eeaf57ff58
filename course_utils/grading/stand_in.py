"""The check modules as a learner's kernel sees them while it is graded: data, no answers.

Inside the sandbox `course_utils/checks/` is replaced by a folder written here. It holds the
framework (`FRAMEWORK`: `checks/__init__.py` and its modules: `Variant`, `for_student`, the
messages' helpers; `wire.py`; `programs.py`, `rank_cases.py`, `pipeline_cases.py` and
`processes.py`) as they are, since none of it knows an answer, and for each lesson a module
of *data* the grader computed, with no code of the lesson's:

- `for_student`, and `given_K` answering with the numbers the grader drew for this student;
- the material the lesson's solution notebook takes from the module (`l08.their_timeline`,
  `l11.their_schedule`, `l12.moe_layout`, ...: what an exercise is about), each computed in
  the grader for this student, for every call the lesson declares in its `MATERIAL` (by
  default the call with the variant alone), and handed back as a fresh copy of that value.

No function of a lesson runs in the kernel, so none can be called to compute an answer
(`l11._culprit(variant)` used to hand out Exercise 11.5's): the checks, the reference
implementations, the expected answers and whatever computes them stay in the grader. An
answer that hands back `l03._bubble` or `l06.ring_messages` raises, in the learner's own
kernel, an AttributeError saying the checks belong to the grader. `check.exercise_K(...)` in
a learner's cell does nothing there (it prints that the grader judges the answer), so a cell
that calls it still runs to its end.
"""

from __future__ import annotations

import base64
import inspect
import json
import pickle
import re
import shutil
from pathlib import Path
from types import ModuleType

import course_utils.checks as real_checks

CHECKS = Path(real_checks.__file__).parent
# Copied as they are (none of them knows an answer): the framework `checks/__init__.py`
# re-exports from its modules, `wire.py` carries answers as data, and `programs.py` runs a
# learner's rank program on the devices on the cases of `rank_cases.py` (the kernel's side
# of a per-rank Build, with the pipeline Builds' cases of `pipeline_cases.py`; the references
# the grader judges them against, `rank_references.py` and the `*_build.py` verdicts,
# stay out); `processes.py` runs lesson 13's worker files on real processes (what their runs
# are judged against, `worker_runs.py`, stays out too).
FRAMEWORK = (
    "__init__.py",
    "feedback.py",
    "reading.py",
    "judging.py",
    "fields.py",
    "variants.py",
    "declaring.py",
    "scoring.py",
    "wire.py",
    "programs.py",
    "rank_cases.py",
    "pipeline_cases.py",
    "recorded_cases.py",
    "processes.py",
)
USES = re.compile(r"\bl(\d\d)\.([A-Za-z_]\w*)")
NOT_MATERIAL = re.compile(r"for_student|(given|exercise|cases)_\d+")
KEPT_BY_GRADER = "belongs to the course's checks"  # in the error a learner's kernel sees

LESSON = '''"""Lesson @NN@: the numbers and material a graded notebook may use, as data the grader
computed for this student (written by course_utils.grading.stand_in)."""

from course_utils import checks as _checks

for_student = _checks.lesson_checks(__name__)


def _stand_ins(numbers: str, material: str) -> dict:
    import base64
    import json
    import pickle

    from course_utils.checks.wire import decode

    def given_from(value):
        def given(variant=None):
            return decode(value)

        return given

    def material_from(name, spec):
        def stand_in(*args, **kwargs):
            bound = dict(spec["defaults"])
            bound.update(zip(spec["params"], args))
            bound.update(kwargs)
            bound.pop("variant", None)
            found = spec["results"].get(json.dumps(sorted(bound.items()), default=repr))
            if found is None:
                raise ValueError(
                    f"{__name__}.{name}: while your notebook is graded only these calls are "
                    f"prepared: {'; '.join(spec['calls'])}"
                )
            return pickle.loads(base64.b64decode(found))

        return stand_in

    made = {}
    for k, value in json.loads(numbers).items():
        made[f"given_{k}"] = given_from(value)
    for name, spec in json.loads(material).items():
        made[name] = material_from(name, spec)
    for name, function in made.items():
        function.__name__ = function.__qualname__ = name
    return made


globals().update(_stand_ins(@NUMBERS@, @MATERIAL@))
del _stand_ins


def __getattr__(name: str):
    # Only while graded: the checks live in the grader, where this notebook cannot reach them.
    if name.startswith("exercise_"):
        def judged_by_the_grader(*args, **kwargs):
            print(f"({__name__.rsplit('.', 1)[-1]}.{name}: your answer is judged by the grader)")

        return judged_by_the_grader
    raise AttributeError(
        f"{__name__}.{name} belongs to the course's checks, which the grader keeps to itself "
        "while your notebook is graded: compute the answer in your own code"
    )
'''


def material_names(solution, lesson: int) -> set[str]:
    """The names the lesson's solution notebook uses from `course_utils.checks.lNN`, but
    `for_student` and the numbers (`given_K`), which every stand-in has."""
    found = set()
    for cell in solution.cells:
        if cell.cell_type == "code":
            for number, name in USES.findall(cell.source):
                if int(number) == lesson and not NOT_MATERIAL.fullmatch(name):
                    found.add(name)
    return found


def _key(bound: dict) -> str:
    return json.dumps(sorted(bound.items()), default=repr)


def material(module: ModuleType, names: set[str], variant) -> dict:
    """{name: what the stand-in needs to answer each declared call of `module.name` for
    `variant`}: the function's parameters, its defaults, and each call's result, pickled."""
    declared = getattr(module, "MATERIAL", {})
    found = {}
    for name in sorted(names):
        function = getattr(module, name, None)
        if not callable(function):
            continue
        parameters = inspect.signature(function).parameters
        defaults = {
            n: p.default
            for n, p in parameters.items()
            if n != "variant" and p.default is not inspect.Parameter.empty
        }
        results, calls = {}, []
        for extra in declared.get(name, [{}]):
            data = pickle.dumps(function(**extra, variant=variant))
            if b"course_utils.checks" in data:  # the kernel could not load it: the grader's bug
                raise RuntimeError(f"{module.__name__}.{name} returns an object of the checks")
            results[_key({**defaults, **extra})] = base64.b64encode(data).decode()
            calls.append(f"{name}(variant{''.join(f', {k}={v!r}' for k, v in extra.items())})")
        found[name] = {
            "params": list(parameters),
            "defaults": defaults,
            "results": results,
            "calls": calls,
        }
    return found


def write(folder: Path, solution, module: ModuleType, variant) -> Path:
    """Write the stand-in `checks` package into `folder` (created) and return it: the graded
    lesson's module (`module`, with `solution` its solution notebook) holds `variant`'s numbers
    and material; every other lesson's only `for_student`."""
    from course_utils.checks.wire import encode

    folder.mkdir(parents=True, exist_ok=True)
    for name in FRAMEWORK:
        shutil.copyfile(CHECKS / name, folder / name)
    lesson = int(module.__name__.rsplit(".l", 1)[-1])
    numbers = {
        found.group(1): encode(getattr(module, attr)(variant))
        for attr in dir(module)
        if (found := re.fullmatch(r"given_(\d+)", attr))
    }
    prepared = material(module, material_names(solution, lesson), variant)
    for path in sorted(CHECKS.glob("l[0-9][0-9].py")):
        mine = int(path.stem[1:]) == lesson
        text = LESSON.replace("@NN@", path.stem[1:])
        text = text.replace("@NUMBERS@", repr(json.dumps(numbers if mine else {})))
        text = text.replace("@MATERIAL@", repr(json.dumps(prepared if mine else {})))
        (folder / path.name).write_text(text, encoding="utf-8")
    return folder
