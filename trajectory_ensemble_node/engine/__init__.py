"""The ROS-free engine: candidate groups in, one reduced action per group out.

See :mod:`.scheduler` for the iteration model and :mod:`.request` for the request/handle types.
"""

from .context import ExecutionContext, LatencyEstimator
from .deadline import StepCosts
from .reduction import reduce_candidates
from .request import OVERSIZE_POLICIES, EngineConfig, GroupHandle, GroupRequest, ProgressEvent
from .scheduler import GroupEngine
from .status import GroupStatus
from .validity import POSITION_POLICIES, ValidityCheck, ValidityPolicy
