"""The fleet plan: how many machines of each catalog kind carry a target load under the SLO, and what they cost.

UTILISATION is the headroom every plan assumes, the fleet plan's and the Kubernetes autoscaler's alike
(deploy/kubernetes.py): each machine or pod is loaded to this share of its measured capacity at most, the rest
left for bursts, a lost machine's share until it is replaced, and the measurement's own spread.
"""

from __future__ import annotations

UTILISATION = 0.8  # the share of the measured capacity a machine or pod is planned to carry
