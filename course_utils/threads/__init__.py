"""The course's "cluster": CPU threads standing in for accelerators, and messages between them.

- `devices`      `DeviceThreads`: persistent threads, one per device, one core's worth each
- `mailboxes`    messages between device threads, and the proof that waiting devices are stuck
- `collectives`  `ThreadGroup`: point-to-point mailboxes between threads with byte counters,
                 and the collectives (all-reduce, ...) written out with sends and receives
- `ring`         the same collectives on paper: chunk plans, bytes per rank, and a one-thread
                 replay of the ring all-reduce for drawing
- `ranks`        `run_ranks`: a learner's per-rank program on the device threads (`rank_run`:
                 its result as evidence, or the one error naming rank and action; `saved`:
                 the activations autograd holds, counted)
- `async_comm`   non-blocking collectives (`async_op=True`) for those programs, run by a
                 communication stream per rank beside its compute
- `watched`      `run_watched`: such a program watched, each collective's bytes to every rank,
                 each message named, and the buffers it holds by weak reference (its memory)

Every parallel dimension of the course (`course_utils.pipeline.executor`,
`course_utils.parallel`) runs on these. Importing `devices` or `collectives` imports
torch; `ring` is arithmetic only.
"""
