"""Pipeline parallelism: schedules as data, predicted by a simulator, run for real on threads.

- `schedules`  the schedule builders and the registry `SCHEDULES` (one entry per schedule)
- `simulate`   a schedule and a cost model -> a predicted `Timeline`; `validate` grades orders
- `executor`   runs any schedule on a real model, one CPU thread per device (imports torch)
- `zero_bubble` the backward split in two (I and W) that the executor runs for ZB schedules
- `export`     writes a schedule in the CSV format PyTorch's pipelining runtime loads

    from course_utils.pipeline import CostModel, make_schedule, simulate
    timeline = simulate(make_schedule("1f1b", 4, 8), CostModel(forward=1, backward=2))

Importing this package does not import torch; import `course_utils.pipeline.executor` to
run schedules for real.
"""

from course_utils.actions import Action, Schedule
from course_utils.pipeline.schedules import SCHEDULES, Case, make_schedule, schedule_info
from course_utils.pipeline.simulate import CostModel, simulate, simulate_arrays, validate

__all__ = [
    "SCHEDULES",
    "Action",
    "Case",
    "CostModel",
    "Schedule",
    "make_schedule",
    "schedule_info",
    "simulate",
    "simulate_arrays",
    "validate",
]
