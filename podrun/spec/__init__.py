"""The job spec: its model (model.py), the fields' own types and parsers (fields.py), what each field
expects in an error's words (messages.py), reading a file into it (loading.py), its errors (problems.py),
its run/setup commands checked (commands.py), and a spec made of exec's flags (adhoc.py). Nothing is
imported here: messages.py stays light for the CLI's start-up."""
