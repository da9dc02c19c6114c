"""Static pictures for the course and the reports: matplotlib figures of slotlab's state and events,
returned as PNG so they are committed inside the notebooks and show with no kernel (GitHub, nbviewer,
VS Code). Each module draws one concept; `png.py` turns a figure into a deterministic PNG."""
