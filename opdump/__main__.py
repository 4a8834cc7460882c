from .cli.main import program

program()
