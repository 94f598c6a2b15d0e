"""The link between a node's engine process and its fronts: frames over a
socket pair (``frames``), the engine's side (``service``) and a front's side
(``remote``)."""
