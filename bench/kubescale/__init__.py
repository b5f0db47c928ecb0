"""The pieces of bench/kube_scale.py: a control plane of its own, a fast loader of Nodes
and bound pods, the service under measurement, and /proc readings."""
