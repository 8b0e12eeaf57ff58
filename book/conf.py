"""Sphinx configuration of the course book (`make book`; book/build.py writes the sources).

MyST-NB reads the executed notebooks and never runs one (`nb_execution_mode = "off"`): the
outputs are those of the run by `make test`. Math is typeset by MathJax, which Sphinx loads
from its CDN: a page read offline shows the TeX source of its formulas.
"""

project = "Training large neural networks in parallel"
author = "the course's authors"
html_show_copyright = False
extensions = ["myst_nb"]
nb_execution_mode = "off"
nb_merge_streams = True  # a cell's printed lines as one block, as JupyterLab shows them
myst_enable_extensions = ["dollarmath", "amsmath"]
nitpicky = True
# The exercise notebooks put each exercise under an H3 below the title, as JupyterLab shows
# them well; the book takes their headings as they are. Every other warning fails the build.
suppress_warnings = ["myst.header"]

html_theme = "alabaster"
html_theme_options = {
    "page_width": "1320px",
    "body_max_width": "none",
    "sidebar_width": "250px",
    "fixed_sidebar": True,
    "show_relbars": True,
    "description": "a hands-on course, rendered from one run",
}
html_sidebars = {"**": ["about.html", "navigation.html", "relations.html", "searchbox.html"]}
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_title = project
html_copy_source = False  # no page's notebook copied beside it: the HTML is the book
html_show_sourcelink = False
