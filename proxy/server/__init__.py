"""The HTTP face: the app and its handlers, request parsing, replies and the ops endpoints.

Everything a client's bytes touch before the planner, and everything rendered back to it after the
walk, lives here; nothing in this package calls an upstream.
"""
