"""The Kubernetes side: node discovery, pod accounting, GenericNode, scheduler extender."""
