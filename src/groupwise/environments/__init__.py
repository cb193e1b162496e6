"""Environments shipped with groupwise (``episode.environment`` names them): a calculator tool for arithmetic
and a guess-the-number game. docs/environments.md describes both and how to write another."""

ENVIRONMENTS = {
    "calculator": "groupwise.environments.calculator:CalculatorEnvironment",
    "guess_number": "groupwise.environments.guess_number:GuessNumberEnvironment",
}
