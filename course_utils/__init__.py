"""Helpers for the course on training large neural networks in parallel.

One module, one idea (read any of them top to bottom):

- `actions`      the vocabulary: `Action` ("2F0") and `Schedule` (per-device action lists)
- `schedules`    naive, GPipe, 1F1B, interleaved, breadth-first, zero-bubble schedules
- `simulate`     turns a schedule and a cost model into a `Timeline`; `validate` grades orders
- `timeline`     the `Timeline` type shared by simulated and measured runs
- `gantt`        draws timelines as Gantt charts (simulated and measured alike)
- `explorer`     the interactive schedule explorer (ipywidgets)
- `models`       tiny real PyTorch models (MLP, character-level GPT) and partitioning
- `executor`     runs any schedule for real on CPU threads, one thread per device
- `collectives`  all-reduce by hand: naive and ring
- `data_parallel`, `tensor_parallel`  the other two kinds of parallelism on threads
- `plan`         memory and throughput model for planning a training run
- `checks`, `grading`  exercise check cells and nbval grading
- `distributed`  the same model on `torch.distributed` processes

Importing this package is fast and never imports torch: only the modules that run
models do.
"""

__version__ = "0.1.0"
