VALUE = "helper imported from the source_dir"
