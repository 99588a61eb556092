"""Old home of the tools, kept as thin re-exports because docs and earlier issues name ``tools/...`` paths.

Issue 46 split them by concern: the operator commands and the dispatcher are :mod:`trajectory_ensemble_node.cli`,
bag replay and open-loop evaluation :mod:`trajectory_ensemble_node.replay`, calibration on a team's own bags
:mod:`trajectory_ensemble_node.calibration`, and the toy's simulator and demo harness
:mod:`trajectory_ensemble_node.demo`. Each module here imports the very same objects from its new home
(tests/test_reexports_tools.py checks that); new code imports the new paths.
"""
