"""mgjit's version: part of every cache key and entry."""
VERSION = "0.1.0"
