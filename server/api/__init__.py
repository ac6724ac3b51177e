"""The API edge: the gRPC servicers, validation of requests, conversion of replies, and the
small shared wire forms (timestamps, enum names, page tokens).
"""
