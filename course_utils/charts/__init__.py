"""Drawing timelines, plans and the lessons' pictures, in one visual language.

- `style`        the course's colours and plot style (a micro-batch has one colour everywhere)
- `gantt`        Gantt charts of simulated and measured timelines (matplotlib)
- `plot`         line charts by label, the way `d2l.plot` serves the d2l book
- `bars`         bar charts: side by side, stacked or horizontal, with labelled lines
- `activations`  micro-batches each device holds over a step
- `placement`    where a model's stages or a batch's shards live
- `tensor_split` how tensor parallelism cuts a matrix multiply
- `grid`         who talks to whom on a tp x pp x dp grid of GPUs
- `collectives`  who holds which piece during an all-reduce, a ring or an all-to-all
- `primer`       the four collectives at a glance: who holds what before and after
- `attention`    attention over workers: blockwise softmax, causal work per worker
- `moe`          a mixture of experts' routing and dispatch
- `explorer`     the interactive schedule explorer (ipywidgets), with its fast raster painter
- `display`      outputs that still say something where widgets are not rendered
"""
