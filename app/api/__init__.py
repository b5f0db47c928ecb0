"""HTTP edge: thin routers that parse, call one service function and shape the answer."""
