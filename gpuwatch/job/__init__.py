"""The job side: everything about the training processes gpuwatch measures from inside.

``hook`` runs in the training process (the only code that imports torch), ``_inject``
puts it there for ``gpuwatch run -- CMD``, ``protocol`` is the datagram schema between the
two sides, ``receiver`` is the daemon's end of it, and ``statusline`` draws a job's live
line on its terminal.
"""
