"""``replay matrix`` and ``replay bisect``: one trace replayed across versions and settings.

``plan`` expands the cartesian product into runs and keeps the manifest (``matrix.json``); ``local``
runs them one after another, ``ray_backend`` as Ray tasks on a cluster (the only module that imports
ray: the ``replay[cluster]`` extra); ``bisect`` searches the release order for the version where an
incident stops (or starts) reproducing; ``commands`` holds the CLI commands.
"""
