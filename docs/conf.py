"""Sphinx configuration: ``make docs`` builds docs/_build/html, warnings are errors."""

from __future__ import annotations

project = "trio_agents"
author = "trio_agents developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
nitpicky = False
html_theme = "alabaster"
suppress_warnings = ["myst.xref_missing"]
