# Developer entry points. `make test` builds everything it needs from nothing: a .venv with the
# project and its lab, its ROS 2 wheels and the trajectory_ensemble_msgs interfaces (built with cmake into the
# venv prefix), then runs pytest. Stamp files in .venv make a second run skip the installs.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3.11
TORCH_VERSION := 2.13.0
OPENPI_CLIENT_VERSION := 0.1.2
VENV := $(CURDIR)/.venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip --disable-pip-version-check
MSG_BUILD := $(CURDIR)/msg/build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST_ARGS ?=
BENCH_ARGS ?=
SOAK_ARGS ?=

# Everything the interface build reads; a change to any of these rebuilds the interfaces.
MSG_SOURCES := $(shell find msg -type f -not -path 'msg/build/*' 2>/dev/null)

# The environment design.md gives for building rosidl interfaces against the PyPI ROS wheels.
ROS_BUILD_ENV := AMENT_PREFIX_PATH=$(VENV) CMAKE_PREFIX_PATH=$(VENV):$(VENV)/lib/python3.11/site-packages

# $(call require,COMMAND,APT PACKAGES): stop with one line naming the package when COMMAND is missing.
require = command -v $(1) >/dev/null 2>&1 || { echo "error: $(1) not found; install it with: sudo apt install $(2)" >&2; exit 1; }

.PHONY: test demo bench soak calibrate-bags venv interfaces colcon clean

test: $(VENV)/.stamp-interfaces $(VENV)/.stamp-openpi-client $(VENV)/.stamp-pusht $(VENV)/.stamp-fleet
	@# pytest exits 5 when it collects nothing; that must fail the build, never pass quietly.
	$(VPY) -m pytest $(PYTEST_ARGS) || { rc=$$?; [ $$rc -ne 5 ] || echo "error: pytest collected no tests" >&2; exit $$rc; }

demo: $(VENV)/.stamp-interfaces $(VENV)/.stamp-pusht
	$(VENV)/bin/trajectory-ensemble demo

bench: $(VENV)/.stamp-interfaces $(VENV)/.stamp-openpi-client
	$(VENV)/bin/trajectory-ensemble bench $(BENCH_ARGS)

# docs/replay-tests.md's calibration figure (issue 32): 100 toy demonstrations to calibrate on, 100 held out, the node
# started for the run (toy policy, N=8). About 10 minutes on 2 cores; writes bench/results/uncertainty-bags.json (.md).
CALIBRATE_BAGS := out/calibrate-bags
calibrate-bags: $(VENV)/.stamp-interfaces
	rm -rf $(CALIBRATE_BAGS)/calibration $(CALIBRATE_BAGS)/heldout
	$(VENV)/bin/trajectory-ensemble bags make-demo-bag $(CALIBRATE_BAGS)/calibration --reference --scenes 100 --scene-seed 1000
	$(VENV)/bin/trajectory-ensemble bags make-demo-bag $(CALIBRATE_BAGS)/heldout --reference --scenes 100 --scene-seed 2000
	$(VENV)/bin/trajectory-ensemble calibrate --bag $(CALIBRATE_BAGS)/calibration --heldout-bag $(CALIBRATE_BAGS)/heldout \
		--alpha 0.05 --count 8 --start-node --rate 4 --replay-out $(CALIBRATE_BAGS)/replays --json bench/results/uncertainty-bags.json

# The long reliability storms of tests/reliability (issue 20): 500-goal soak with RSS growth, a 200-goal burst per
# goal policy, cancel storms, killed clients, a frame flood, hostile weight paths, every engine fault, SIGTERM.
# Under 20 minutes on 2 cores; writes bench/results/soak.json and docs/reliability.md.
# Then the fuzz targets of tests/fuzz (issue 45) under the ci and soak hypothesis profiles, about 12 minutes more: the
# examples each target ran go to bench/results/fuzz.json and the Fuzzing section of docs/reliability.md, which
# soak.py's rewrite of that file drops. Both always run; either failing fails the target.
soak: $(VENV)/.stamp-interfaces $(VENV)/.stamp-openpi-client
	rc=0; PYTHONPATH=$(CURDIR) $(VPY) tests/reliability/soak.py $(SOAK_ARGS) || rc=$$?; \
		PYTHONPATH=$(CURDIR) $(VPY) tests/fuzz/soak_report.py || rc=$$?; exit $$rc

venv: $(VENV)/.stamp-project

interfaces: $(VENV)/.stamp-interfaces

$(VPY):
	@$(call require,$(PYTHON),python3.11 python3.11-venv)
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { echo "error: $(PYTHON) cannot create venvs; install it with: sudo apt install python3.11-venv" >&2; exit 1; }
	@$(call require,cmake,cmake)
	@$(call require,g++,g++)
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: the project's torch>=2.13 is then already met, so pip never pulls a
# multi-GB CUDA build from the index.
$(VENV)/.stamp-torch: | $(VPY)
	$(PIP) install --quiet "torch==$(TORCH_VERSION)"
	touch $@

# The product, then the lab beside it (lab/: benchmarks, training, probes; never in the product's wheel).
$(VENV)/.stamp-project: $(VENV)/.stamp-torch pyproject.toml setup.py setup.cfg lab/pyproject.toml
	$(PIP) install --quiet -e ".[ros,test,build]"
	$(PIP) install --quiet --no-deps -e lab
	touch $@

# openpi-client, the real client the OpenPI tests and `bench --fleet` drive (docs/openpi.md). --no-deps: it pins
# numpy<2, which the ROS Kilted wheels cannot use; its wire code runs on numpy 2, and websockets and msgpack come
# with the project.
$(VENV)/.stamp-openpi-client: $(VENV)/.stamp-project
	$(PIP) install --quiet --no-deps "openpi-client==$(OPENPI_CLIENT_VERSION)"
	touch $@

# Ray Serve, the product's optional extra .[fleet] (serve-ray, docs/scaling.md): the fleet tests run on a local Ray
# instance with CPU replicas. The base install never imports it (tests/fleet/test_base_install_without_ray.py).
$(VENV)/.stamp-fleet: $(VENV)/.stamp-project
	$(PIP) install --quiet "ray[serve]==2.60.0"
	$(VPY) -c "import ray, ray.serve; assert ray.__version__ == '2.60.0', ray.__version__"
	touch $@

# gym-pusht, the PushT environment of the lab's expert, demonstrations and benchmark (docs/pusht.md), as published:
# it resolves against the ROS wheels' numpy as it is. A lab and test dependency; the product's wheel never imports it.
$(VENV)/.stamp-pusht: $(VENV)/.stamp-project
	$(PIP) install --quiet "gym-pusht==0.1.8"
	$(VPY) -c "import gymnasium as gym, gym_pusht; env = gym.make('gym_pusht/PushT-v0'); env.reset(seed=0); env.step(env.action_space.sample())"
	touch $@

# The PushT demonstrations (docs/pusht.md): the expert on starts 0..259 with expert seeds 0 and 1, successes kept as
# rosbag2 in out/pusht/demos/bags (>= 200), the record in bench/results/pusht_expert.json. About 40 minutes on one core.
PUSHT_DEMOS := out/pusht/demos
.PHONY: pusht-demos
pusht-demos: $(VENV)/.stamp-interfaces $(VENV)/.stamp-pusht
	rm -rf $(PUSHT_DEMOS)
	$(VENV)/bin/trajectory-ensemble pusht-demos --episodes 260 --seed 0 --expert-seeds 0,1 --out $(PUSHT_DEMOS) \
		--json bench/results/pusht_expert.json

$(VENV)/.stamp-interfaces: $(VENV)/.stamp-project $(MSG_SOURCES)
	@$(call require,cmake,cmake)
	@$(call require,g++,g++)
	@$(VPY) -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
		|| { echo "error: Python.h not found; install it with: sudo apt install python3.11-dev" >&2; exit 1; }
	$(ROS_BUILD_ENV) cmake -S msg -B $(MSG_BUILD) -DCMAKE_INSTALL_PREFIX=$(VENV) \
		-DPython3_EXECUTABLE=$(VPY) -DBUILD_TESTING=OFF --log-level=WARNING
	$(ROS_BUILD_ENV) cmake --build $(MSG_BUILD) -j $(JOBS) -- --no-print-directory >/dev/null
	cmake --install $(MSG_BUILD) >/dev/null
	$(VPY) -c "from trajectory_ensemble_msgs.action import GenerateTrajectory"
	touch $@

# The colcon workspace: ros2_ws/src links back to this folder and to msg/, so both packages build
# from the same files. Same command as in docs/development.md.
colcon: $(VENV)/.stamp-project
	cd ros2_ws && source ../.venv/bin/activate && \
		AMENT_PREFIX_PATH=$$VIRTUAL_ENV \
		CMAKE_PREFIX_PATH=$$VIRTUAL_ENV:$$VIRTUAL_ENV/lib/python3.11/site-packages \
		colcon build --cmake-args -DPython3_EXECUTABLE=$$VIRTUAL_ENV/bin/python -DBUILD_TESTING=OFF

clean:
	rm -rf $(VENV) $(MSG_BUILD) ros2_ws/build ros2_ws/install ros2_ws/log \
		trajectory_ensemble.egg-info lab/trajectory_ensemble_lab.egg-info .pytest_cache .hypothesis
