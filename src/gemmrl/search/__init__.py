"""Search over kernel configurations: the space as data (space.py) and an analytic prior (costmodel.py).
Nothing here imports torch or triton."""
