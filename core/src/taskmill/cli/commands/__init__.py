"""taskmill's own commands, one module per group; each module's ``add_commands(add)``
declares its commands and their options (as a plugin's ``taskmill_register_commands``
declares its own), next to the code that runs them."""
