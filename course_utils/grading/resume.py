"""Whether an earlier grade still holds: the resume key, defined here and nowhere else.

A rerun of `grade --csv grades.csv` keeps a row of the earlier run (`journal`) only when the
notebook would be graded under the same key now. The key is everything a verdict depends on:

- `notebook`: the file's path, and `notebook_sha256`, the SHA-256 of its bytes;
- `files_sha256`: the student's other files that reach the kernel (names and bytes);
- `checks`: a fingerprint of what judged it: the lesson's solution notebook (the answers
  captured, the locked cells) and the check package's code (that lesson's module and the
  framework around it);
- `variant`: whose numbers; `lesson`: which lesson it was graded as.

`ResumeKey.changes(earlier)` names what differs ("the notebook changed", "its other files
changed", ...), so that a rerun can say why each row was graded again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

WHY = {
    "notebook": "it is another file",
    "notebook_sha256": "the notebook changed",
    "files_sha256": "its other files changed",
    "checks": "the solutions or the checks changed",
    "variant": "it is graded on other numbers",
    "lesson": "it is graded as another lesson",
}


@dataclass(frozen=True)
class ResumeKey:
    notebook: str
    notebook_sha256: str
    files_sha256: str
    checks: str
    variant: str
    lesson: int

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> ResumeKey | None:
        """The key a journal's row recorded (None for a row written without one)."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            return None
        return cls(**data)

    def changes(self, earlier: ResumeKey | None) -> list[str]:
        """Why a notebook graded under `earlier` is graded again under this key ([] if it
        is not: the earlier grade holds)."""
        if earlier is None:
            return ["it was not graded before"]
        return [why for name, why in WHY.items() if getattr(self, name) != getattr(earlier, name)]


def checks_fingerprint(lesson: int, solutions: Path) -> str:
    """A SHA-256 of the lesson's solution notebook and the check package's code that judges
    it: its own module and every module of the package that is not another lesson's. Read
    afresh on every call (a few hundred kB): a long-lived process (pytest's, say) may see
    them edited, and its workers judge with what is on disk."""
    from course_utils.grading.grader import solution_for

    digest = hashlib.sha256()
    try:
        digest.update(solution_for(lesson, solutions).read_bytes())
    except (OSError, ValueError):
        digest.update(b"no solution")
    import course_utils.checks as checks

    package = Path(checks.__file__).parent
    for path in sorted(package.rglob("*.py")):
        other = re.fullmatch(r"l(\d\d)\.py", path.name)
        if path.parent == package and other and int(other.group(1)) != lesson:
            continue
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def files_fingerprint(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(hashlib.sha256(name.encode()).digest())
        digest.update(hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


def resume_key(
    notebook: str,
    data: bytes | None,
    files: dict[str, bytes],
    variant: str,
    lesson: int | None,
    solutions: Path,
) -> ResumeKey:
    """The key of `notebook` (its bytes `data`, `files` beside it), graded on `variant`'s
    numbers as `lesson` (None: it could not be read)."""
    return ResumeKey(
        notebook=notebook,
        notebook_sha256=hashlib.sha256(data).hexdigest() if data is not None else "",
        files_sha256=files_fingerprint(files),
        checks=checks_fingerprint(lesson, solutions.resolve()) if lesson else "",
        variant=variant,
        lesson=lesson or 0,
    )
