"""The format readers behind worker/formats.py: a worker's share of a data file, split into chunks of cells.

share.py holds what they all use; criteo_reader.py, csv_reader.py (+ csv_header.py, csv_records.py, csv_sample.py)
and libsvm_reader.py each read one format and state it at their top. They never import worker/formats.py, which imports
them.
"""
