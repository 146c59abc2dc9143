"""Sphinx configuration of the web edition (built by .ci/build-site from docs/site/stage.py's output).

The notebooks are rendered as stored (myst-nb, execution off); the theme (furo) ships its CSS,
JS and icons inside the package and uses system fonts, so building and reading need no internet.
Nothing here loads from a CDN: widget JavaScript is off (stage.py replaces widgets by static
panels) and no extension that needs MathJax is enabled.
"""
project = "Distributed training, run for real"
html_title = project
author = "the course authors"
language = "en"

extensions = ["myst_nb"]
nb_execution_mode = "off"          # the stored outputs are the truth; no kernel at build time
nb_ipywidgets_js = {}              # never add the widget manager's CDN scripts
nb_merge_streams = True            # one block per cell, not one per print flush
myst_heading_anchors = 3           # GitHub-style slugs, so README-style #anchors resolve
myst_enable_extensions = []        # plain CommonMark + tables; no dollarmath, so no MathJax

smartquotes = False                # "--use-megatron-fsdp" must stay two hyphens when copied
highlight_language = "none"        # a fence without a language stays plain (notebook cells: python)
exclude_patterns = ["**/.ipynb_checkpoints"]
suppress_warnings = ["myst.header"]  # notebooks may skip a heading level; harmless on a page

html_theme = "furo"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_copy_source = False           # the .ipynb files are the source; readers get Binder for those
html_show_sourcelink = False
html_show_sphinx = False
html_show_copyright = False
html_last_updated_fmt = None
html_theme_options = {
    "navigation_with_keys": True,
    "top_of_page_buttons": [],     # furo's "view/edit source" needs a repository URL; none here
}
