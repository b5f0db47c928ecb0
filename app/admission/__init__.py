"""The one admission path every way in (REST, scheduler extender, GenericNode) shares."""
