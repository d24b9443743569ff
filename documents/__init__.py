"""Documents that users attach to a conversation, and the retrieval of their passages.

An app of its own, below the chat app (`generation`) and above `accounts` in the layers
contract: the chat's services call `retrieval_for` when they build an answer's prompt,
and documents reach conversations only through their foreign key, never by importing
the chat app. Everything about files — reading them, splitting them into passages,
indexing and searching those in the database — stays here, so the chat app sees one
function and the sources it returns.
"""
