"""Operations written once above the engines (`repository.OperatedRepository`),
and what they ask of an engine inside a unit of work (`rows.Rows`)."""
