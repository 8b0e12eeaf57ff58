"""The course's "cluster": CPU threads standing in for accelerators, and messages between them.

- `devices`      `DeviceThreads`: persistent threads, one per device, one core's worth each
- `mailboxes`    messages between device threads, and the proof that waiting devices are stuck
- `collectives`  `ThreadGroup`: point-to-point mailboxes between threads with byte counters,
                 and the collectives (all-reduce, ...) written out with sends and receives
- `ring`         the same collectives on paper: chunk plans, bytes per rank, and a one-thread
                 replay of the ring all-reduce for drawing

Every parallel dimension of the course (`course_utils.pipeline.executor`,
`course_utils.parallel`) runs on these. Importing `devices` or `collectives` imports
torch; `ring` is arithmetic only.
"""
