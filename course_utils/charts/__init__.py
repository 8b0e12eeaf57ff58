"""Drawing timelines and plans, in one visual language.

- `style`     the course's colours and plot style (a micro-batch has one colour everywhere)
- `gantt`     Gantt charts of simulated and measured timelines (matplotlib)
- `explorer`  the interactive schedule explorer (ipywidgets), with its fast raster painter
- `display`   outputs that still say something where widgets are not rendered
"""
