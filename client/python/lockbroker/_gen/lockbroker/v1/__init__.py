# Copied from gen/python by client/python/tools/sync_gen.py. DO NOT EDIT.
