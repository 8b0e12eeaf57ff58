"""Helpers for the course on training large neural networks in parallel.

A folder is one family of ideas; a module is one idea (read any of them top to bottom).

The vocabulary, shared by everything:
- `actions`    an action ("2F0", "1REDUCE_GRAD"), the table of action kinds, a `Schedule`
- `timeline`   what each device did when: the `Timeline` of simulated and measured runs
- `models`     tiny real PyTorch models (MLP, character-level GPT), their data, partitioning
- `errors`     the errors the course raises on purpose
- `versions`   the PyTorch releases the course supports, and what an older one lacks

The families:
- `pipeline/`     schedules and their registry, the simulator, the thread executor, the export
                  to PyTorch's schedule format, the V-shaped schedules
- `threads/`      CPU threads standing in for devices, and collectives written out with sends
- `parallel/`     data, tensor, sharded (FSDP), sequence, context and expert parallelism on
                  threads; simulated data-parallel timelines; the cost of collectives
- `charts/`       Gantt charts, the schedule explorer, the course's colours, and the lessons'
                  line and bar charts and diagrams (`plot`, `bar_chart`, ...)
- `plan/`         memory and step-time planner for a real training run
- `measure/`      measuring truthfully: the capacity probe, timing, reference recordings,
                  conclusions printed from the numbers, activation memory, the set-up check
- `distributed/`  the same computations on real `torch.distributed` processes, and a
                  training program for `torchrun` (`distributed.train`) on a laptop or a cluster
- `checks/`       the exercises' checks (per-student numbers, kind feedback)
- `grading/`      for instructors: exercise notebooks from the solutions, and the grader
- `commands/`     the command-line tools (`python -m course_utils --help`)

Importing this package is fast and never imports torch: only the modules that run
models do.
"""

__version__ = "0.1.0"
