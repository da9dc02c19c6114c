"""The live JupyterLab panel (a view over engine events; see view.Panel)."""

from slotlab.panel.fleet import FleetView
from slotlab.panel.state import PanelState
from slotlab.panel.view import Panel

__all__ = ["FleetView", "Panel", "PanelState"]
