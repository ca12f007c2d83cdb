"""One module per API family: thin translation between requests and the subsystems.

``registry`` holds the ``@api`` decorator and the RequestContext; ``catalog`` imports every
handler module so its handlers register.
"""
