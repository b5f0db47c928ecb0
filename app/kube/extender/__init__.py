"""The kube-scheduler extender: its wire types (wire), the service over the admissions
(service) and its HTTP routes (routes); the decisions are pure (app.core.placement)."""
