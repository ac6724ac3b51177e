"""The thermodynamics: heat and its decay, lifecycle states, utility, the graph that
spreads heat, the gates, and the channel policy that sets their numbers.
"""
